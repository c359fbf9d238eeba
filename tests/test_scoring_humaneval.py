"""HumanEval scorer: the package's data and checks, the sandbox, post-processing, pass@k, the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.scoring import humaneval as he

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def problems():
    return he.load_problems()


def _leftover_sandbox_processes() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if he.SANDBOX_MARKER.encode() in cmdline:
                pids.append(int(entry))
    return pids


# ----------------------------------------------------------------------------- acceptance figures


def test_canonical_solutions_pass_all_164(problems):
    preds = [{"id": k, "prediction": p["canonical_solution"]} for k, p in problems.items()]
    result = he.score_predictions(preds, problems, workers=2)
    failed = [(d["id"], d["result"]) for d in result["details"] if not d["passed"]]
    assert failed == []
    assert result["num_tasks"] == 164 and result["num_passed"] == 164 and result["score"] == 1.0


def test_empty_completions_pass_none(problems):
    preds = [{"id": k, "prediction": ""} for k in problems]
    result = he.score_predictions(preds, problems, workers=2)
    assert result["num_passed"] == 0 and result["score"] == 0.0


# ----------------------------------------------------------------------------- sandbox


def test_sandbox_reports_its_layers():
    result = he.run_sandboxed("x = 1")
    assert result.passed, result
    assert "rlimits" in result.layers and "python-guards" in result.layers
    if os.geteuid() == 0:
        assert "uid" in result.layers and "netns" in result.layers


@pytest.mark.parametrize(
    "attempt",
    [
        "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=2).sendall(b'leak')",
        # below the Python guard: the C module directly
        "import _socket\ns = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\ns.settimeout(2)\n"
        "s.connect(('127.0.0.1', PORT))\ns.send(b'leak')",
    ],
)
def test_socket_is_refused(attempt):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []
    done = threading.Event()

    def serve():
        while not done.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(conn.recv(16))
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    result = he.run_sandboxed(attempt.replace("PORT", str(port)), he.SandboxLimits(timeout_s=4))
    time.sleep(0.3)  # a connection in flight would be accepted by now
    done.set()
    thread.join()
    server.close()
    assert not result.passed
    assert accepted == []


@pytest.mark.parametrize(
    "how",
    [
        "open(TARGET, 'w').write('x')",
        "import os\nfd = os.open(TARGET, os.O_WRONLY | os.O_CREAT, 0o666)\nos.write(fd, b'x')",
        # below the Python guards: libc directly is refused too (ctypes is blocked at import)
        "import pathlib\npathlib.Path(TARGET).write_text('x')",
    ],
)
def test_write_outside_temp_dir_is_refused(tmp_path, how):
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o777)  # only the sandbox, not file permissions, may stop the write
    target = outside / "written.txt"
    result = he.run_sandboxed(how.replace("TARGET", repr(str(target))))
    assert not result.passed
    assert not target.exists()
    assert list(outside.iterdir()) == []


def test_write_inside_temp_dir_is_allowed():
    program = "open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'"
    assert he.run_sandboxed(program).passed


def test_fork_bomb_is_contained():
    before = _leftover_sandbox_processes()
    # posix.fork bypasses the Python guard on os.fork: only the process limit and the kill stop it
    program = "import posix\nwhile True:\n    try:\n        posix.fork()\n    except OSError:\n        pass"
    start = time.perf_counter()
    result = he.run_sandboxed(program, he.SandboxLimits(timeout_s=2))
    elapsed = time.perf_counter() - start
    assert not result.passed
    assert elapsed < 2 + 2 + 6
    time.sleep(0.2)
    assert _leftover_sandbox_processes() == before == []


def test_unbounded_allocation_fails_with_memory_error():
    program = "chunks = []\nwhile True:\n    chunks.append([0] * 10**7)"
    start = time.perf_counter()
    result = he.run_sandboxed(program, he.SandboxLimits(timeout_s=10, memory_mb=256))
    assert result.status == "failed" and "MemoryError" in result.detail
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize(
    "program",
    [
        "while True:\n    pass",
        # swallows the in-process alarm: the parent's wall-clock kill must end it
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass",
    ],
)
def test_infinite_loop_times_out(program):
    start = time.perf_counter()
    result = he.run_sandboxed(program, he.SandboxLimits(timeout_s=1.5))
    elapsed = time.perf_counter() - start
    assert result.status == "timed out"
    assert elapsed < 1.5 + 2 + 3
    assert _leftover_sandbox_processes() == []


def test_early_exit_is_not_a_pass():
    assert not he.run_sandboxed("import os\nos._exit(0)").passed
    assert not he.run_sandboxed("raise SystemExit(0)").passed


# ----------------------------------------------------------------------------- post-processing


def test_continuation_is_cut_at_new_top_level_statement(problems):
    problem = problems["HumanEval/0"]
    body = problem["canonical_solution"]
    tail = "\n\ndef other():\n    pass\n\nprint(has_close_elements([1.0], 0.5))\n"
    assert he.truncate_continuation(problem["prompt"], body + tail) == body + "\n\n"
    # a column-0 line inside a multi-line string does not end the function
    text = '    s = """\nnot code\n"""\n    return False\nif __name__ == "__main__":\n    pass\n'
    assert he.truncate_continuation(problem["prompt"], text) == '    s = """\nnot code\n"""\n    return False\n'


def test_chat_answer_extraction_keeps_imports_and_helpers(problems):
    problem = problems["HumanEval/0"]
    answer = (
        "Sure! Here is the function:\n\n```python\nimport itertools\nfrom typing import List\n\n"
        "def _close(a, b, t):\n    return abs(a - b) < t\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return any(_close(a, b, threshold) for a, b in itertools.combinations(numbers, 2))\n\n"
        "print(has_close_elements([1.0, 2.0], 0.5))\nif __name__ == '__main__':\n    assert False\n```\n"
        "It compares every pair."
    )
    completion = he.postprocess(problem, answer, "chat")
    assert "print(" not in completion and "__main__" not in completion
    assert he.run_sandboxed(he.check_program(problem, completion)).passed


def test_chat_answer_with_unterminated_fence_and_body_only(problems):
    problem = problems["HumanEval/0"]
    unterminated = "```python\ndef has_close_elements(numbers, threshold):\n" + problem["canonical_solution"]
    assert he.run_sandboxed(he.check_program(problem, he.postprocess(problem, unterminated, "chat"))).passed
    body_only = "```\n" + problem["canonical_solution"] + "```"
    assert he.run_sandboxed(he.check_program(problem, he.postprocess(problem, body_only, "chat"))).passed


# ----------------------------------------------------------------------------- pass@k and CLI


def test_pass_at_k_with_several_samples(problems):
    p0, p1 = problems["HumanEval/0"], problems["HumanEval/1"]
    preds = [
        {"id": "HumanEval/0", "prediction": p0["canonical_solution"]},
        {"id": "HumanEval/0", "prediction": "    return None\n"},
        {"id": "HumanEval/1", "prediction": p1["canonical_solution"]},
        {"id": "HumanEval/1", "prediction": p1["canonical_solution"]},
    ]
    result = he.score_predictions(preds, problems, ks=(1, 2, 10))
    assert result["score"] == pytest.approx(0.75)
    assert result["pass_at_k"] == {"pass@1": pytest.approx(0.75), "pass@2": pytest.approx(1.0)}
    assert result["missing_tasks"] == 162


def test_unknown_task_id_is_an_error(problems):
    with pytest.raises(KeyError):
        he.score_predictions([{"id": "HumanEval/999", "prediction": ""}], problems)


def test_cli_rescoring_saved_predictions(tmp_path, problems):
    preds = tmp_path / "preds.jsonl"
    rows = [
        {"id": "HumanEval/2", "prediction": problems["HumanEval/2"]["canonical_solution"] + "\ndef junk(:\n"},
        {"id": "HumanEval/3", "prediction": "```python\n" + problems["HumanEval/3"]["prompt"]
         + problems["HumanEval/3"]["canonical_solution"] + "```", "format": "chat"},
    ]
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.scoring.humaneval", "--predictions", str(preds)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )
    result = json.loads(out.stdout)
    assert result["num_passed"] == 2 and result["score"] == 1.0
    assert [d["id"] for d in result["details"]] == ["HumanEval/2", "HumanEval/3"]
