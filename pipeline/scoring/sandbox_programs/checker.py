"""The HumanEval sandbox's checker: a trusted interpreter outside the sandbox, ``python -I -S -B -c <this file>``.

The payload (the sandbox's command, seccomp filter, limits, the problem's prompt and test code, the
completion) comes on stdin; the verdict goes out as one JSON line on stdout. It starts the sandboxed
server (its child), runs the problem's prompt and test code (dataset code, not model output) and calls
``check(candidate)`` with a ``candidate`` that forwards each call to the server and decodes the answer:
"passed" only if ``check`` returned. ``pipeline.scoring.humaneval`` builds the program from this file
(the codec's text in place of the import from it).
"""

if __name__ != "__main__":
    raise ImportError("a program that humaneval.py runs with `python -c`, not a module to import")
import os
import resource
import signal
import struct
import subprocess
import sys
import threading
import time

from pipeline.scoring.sandbox_programs.codec import _dec, _describe, _enc, _json  # noqa: E402 - inlined by the build

_cgroups = sys.argv[1:]  # on the command line: known even if the scorer dies before the payload is written
_t0 = time.monotonic()
layers = ["bwrap", "seccomp", "rlimits", "separate-checker", "checker-rlimits"]


def _release_cgroups():
    # the sandbox is gone: leave the run's cgroups for their parent and remove them (the scorer that
    # started this checker removes them too; whichever of the two outlives the run succeeds)
    for path in _cgroups:
        try:
            with open(os.path.dirname(path) + "/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass
        for _ in range(250):
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)


def verdict(status, detail=""):
    if "proc" in globals() and proc.returncode is not None:
        _release_cgroups()
    os.write(
        1,
        (
            _json.dumps({"status": status, "detail": detail[:200], "layers": layers, "seconds": time.monotonic() - _t0})
            + "\n"
        ).encode(),
    )
    os._exit(0)


try:
    payload = _json.loads(sys.stdin.buffer.read())
except ValueError:  # the scorer died before it wrote the whole payload: nothing ran
    _release_cgroups()
    os._exit(1)


class _Timeout(BaseException):
    pass


class CandidateError(Exception):
    pass


class _ServerGone(Exception):  # noqa: N818 - the server process is gone, not an error of ours
    pass


def _alarm(signum, frame):
    raise _Timeout()


fd = os.memfd_create("seccomp", 0) if hasattr(os, "memfd_create") else None
assert fd is not None  # Linux has memfd_create (without it, os.write below would refuse None)
os.write(fd, bytes.fromhex(payload["seccomp"]))
os.lseek(fd, 0, os.SEEK_SET)
cmd = list(payload["cmd"])
cmd[cmd.index("--seccomp") + 1] = str(fd)
info_r, info_w = os.pipe()
cmd[cmd.index("--info-fd") + 1] = str(info_w)


def _limits():
    for path in _cgroups:  # join the run's cgroups before bwrap starts
        with open(path + "/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
    for kind, value in payload["rlimits"]:
        resource.setrlimit(kind, tuple(value))


proc = subprocess.Popen(
    cmd,
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    pass_fds=(fd, info_w),
    preexec_fn=_limits,
    close_fds=True,
)
os.close(fd)
os.close(info_w)


class _CheckerLimit(BaseException):
    pass


def _xcpu(signum, frame):
    raise _CheckerLimit()


def _own_limits():
    # The checker decodes and checks what the sandboxed program chose to send, outside the sandbox's
    # cgroup and rlimits: it gets its own, once the sandbox has started (which it must not inherit).
    # CPU: SIGXCPU (a verdict) at the soft limit, SIGKILL one second later if a C-level loop (a set
    # built by the test code, say) does not return to the interpreter. Memory: the address space it
    # has now plus a fixed budget (a MemoryError is the answer's failure).
    signal.signal(signal.SIGXCPU, _xcpu)
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(used.ru_utime + used.ru_stime) + 1 + int(payload["checker_cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        size = 256 * 2**20
    mem = size + int(payload["checker_memory"])
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))


_over: list[str] = []  # what the watcher stopped the sandbox for


def _count_files(tmp_fd):
    st = os.fstatvfs(tmp_fd)
    return st.f_files - st.f_ffree  # inodes in use on the sandbox's /tmp (a hard link takes one too)


def _count_tasks():
    # the sandbox's init (bwrap, pid 1 inside) and its children (the server: it cannot create another process)
    total = 1
    with open("/proc/%d/task/%d/children" % (sandbox_pid, sandbox_pid)) as f:  # type: ignore[str-format]
        children = f.read().split()
    for child in children:
        with open("/proc/%s/status" % child) as f:
            total += int(next(line for line in f if line.startswith("Threads:")).split()[1])
    return total


def _watch(tmp_fd, base_files, tasks):
    # Kernel memory that no rlimit counts, where no cgroup does: each file of /tmp (the tmpfs caps bytes,
    # not files; about 1 KiB each, 120,000 empty files took 150 MB in 4 s) and each thread (its kernel
    # stack; a thread with a small stack costs little address space). Polled, so the excess is what can
    # be created in one interval.
    while True:
        try:
            if _count_files(tmp_fd) - base_files > payload["max_files"]:
                _over.append("more than %d files in /tmp" % payload["max_files"])
            elif tasks and _count_tasks() > payload["max_tasks"]:
                _over.append("more than %d threads" % payload["max_tasks"])
        except (OSError, ValueError, StopIteration):
            return  # the sandbox is gone
        if _over:
            try:
                os.kill(sandbox_pid, signal.SIGKILL)  # type: ignore[arg-type]
            except OSError:
                pass
            return
        time.sleep(payload["watch_interval_s"])


def _start_watch():
    try:
        tmp_fd = os.open("/proc/%d/root/tmp" % sandbox_pid, os.O_RDONLY | os.O_DIRECTORY)  # type: ignore[str-format]
        base_files = _count_files(tmp_fd)
    except (OSError, ValueError):
        return  # not readable here: the layer is not reported
    try:
        tasks = _count_tasks() > 0
    except (OSError, ValueError, StopIteration):
        tasks = False  # a kernel without /proc/<pid>/task/<tid>/children
    threading.stack_size(256 * 1024)
    threading.Thread(target=_watch, args=(tmp_fd, base_files, tasks), daemon=True).start()
    layers.append("watch-files-and-threads" if tasks else "watch-files")


sandbox_pid = None


def _sandbox_pid():
    # bwrap reports the pid of the sandbox's init (pid 1 of its pid namespace) on the info pipe
    buf = b""
    while True:
        chunk = os.read(info_r, 4096)
        if not chunk:
            return None
        buf += chunk
        try:
            return int(_json.loads(buf)["child-pid"])
        except ValueError:
            continue


def _stop():
    # killing the namespace's init kills every process inside; bwrap returns once they are gone
    if sandbox_pid:
        try:
            os.kill(sandbox_pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # all three are PIPE
_to, _from = proc.stdin.fileno(), proc.stdout.fileno()
MAX = payload["max_message"]

_up = False  # True once the sandboxed interpreter has said hello: from then on, its code may have run


def _gone():
    _stop()
    assert proc.stderr is not None  # PIPE
    err = proc.stderr.read(4000).decode(errors="replace").strip()
    code = proc.returncode
    # a start-up error is bwrap's only before the sandbox is up; after that, whatever is on bwrap's
    # stderr may have been written by the completion (it is the program's failure, not the scorer's)
    if not _up and err.startswith("bwrap:"):
        verdict("error", "sandbox failed to start: " + " ".join(err.split())[:150])
    raise _ServerGone("the program ended without an answer (exit status %s)" % code)


def _readn(n):
    # linear in n however the program trickles its bytes (``bytes +=`` per chunk would be quadratic)
    buf, got = [], 0
    while got < n:
        chunk = os.read(_from, min(n - got, 1 << 20))
        if not chunk:
            _gone()
        buf.append(chunk)
        got += len(chunk)
    return b"".join(buf)


def _recv():
    n = struct.unpack(">I", _readn(4))[0]
    if n > MAX:
        _stop()
        raise CandidateError("answer larger than %d bytes" % MAX)
    return _json.loads(_readn(n))


def _send(obj):
    data = _json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    try:
        while data:
            data = data[os.write(_to, data) :]
    except BrokenPipeError:
        _gone()


def candidate(*args, **kwargs):
    _send({"args": _enc(list(args)), "kwargs": _enc(dict(kwargs))})
    answer = _recv()
    if "ok" in answer:
        return _dec(answer["ok"])
    raise CandidateError(str(answer.get("raised", "malformed answer"))[:200])


signal.signal(signal.SIGALRM, _alarm)
signal.setitimer(signal.ITIMER_REAL, payload["startup_s"])
try:
    hello = _recv()
    _up = True  # the sandbox is up (the completion has not been sent yet)
    sandbox_pid = _sandbox_pid()
    _start_watch()
    _own_limits()  # after the watcher's thread exists (its stack and allocator arena are address space)
    signal.setitimer(signal.ITIMER_REAL, payload["timeout"])
    _send({"code": payload["code"], "entry_point": payload["entry_point"], "max_tasks": payload["max_tasks"]})
    first = _recv()
    if "error" in first:
        raise CandidateError(str(first["error"])[:200])
    if payload["test"] is not None:
        ns: dict = {}
        exec(compile(payload["prompt"], "<prompt>", "exec"), ns)
        ns[payload["entry_point"]] = candidate  # tests that call the function by its name
        exec(compile(payload["test"], "<test>", "exec"), ns)
        ns["check"](candidate)
    signal.setitimer(signal.ITIMER_REAL, 0)
    status, detail = "passed", ""
except _Timeout:
    status, detail = "timed out", "wall-clock limit of %gs" % payload["timeout"]
except _CheckerLimit:
    status, detail = "timed out", "the checker's CPU-time limit (answers too costly to check)"
except CandidateError as err:
    status, detail = "failed", str(err)
except _ServerGone as err:
    status, detail = "failed", _over[0] if _over else str(err)
except BaseException as err:  # noqa: BLE001 - whatever the checked code raised is its failure
    status, detail = "failed", _describe(err)
signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # the verdict is known: only the hard limit (SIGKILL) is left
if _over:  # past a count, whether or not the answers came first
    status, detail = "failed", _over[0]
signal.setitimer(signal.ITIMER_REAL, 0)
_stop()
if proc.returncode == -signal.SIGXCPU or proc.returncode == 128 + signal.SIGXCPU:
    if status != "passed":
        status, detail = "timed out", "CPU-time limit"
verdict(status, detail)
