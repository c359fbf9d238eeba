"""The sandbox's seccomp filter: a classic-BPF allow-list for bwrap's ``--seccomp`` (x86-64 and aarch64),
and the descriptor that hands it to bwrap (the layers of ``pipeline.scoring.sandbox``; see its docstring)."""

from __future__ import annotations

import os
import platform
import struct
import tempfile

from pipeline.scoring.sandbox_limits import SandboxUnavailableError

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
            number = numbers[idx]
            if number is not None:
                prog += [_ins(jeq, number, 0, 1), _ins(ret, action)]
    prog.append(_ins(ret, errno(_ENOSYS)))
    if len(prog) > 4096:  # BPF_MAXINSNS
        raise RuntimeError(f"seccomp filter too long ({len(prog)} instructions)")
    return b"".join(prog)


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
