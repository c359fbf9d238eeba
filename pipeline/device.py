"""The device and the machine: synchronisation, peak memory, machine and library info, git commit.

The one implementation used by the measurement window (``pipeline.measure.window``), the step-cost probe
(``pipeline.measure.costs``) and the benchmark (``pipeline.bench``).
"""

from __future__ import annotations

import hashlib
import os
import platform
import resource
import subprocess
from pathlib import Path
from typing import Any

import torch
import transformers

REPO_ROOT = Path(__file__).resolve().parent.parent


def cuda_uuid(device: Any) -> str | None:
    """The NVML-style UUID (``GPU-...`` / ``MIG-...``) of a torch CUDA device, or None."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def synchronize(device: torch.device | str) -> None:
    """Wait for all queued work on ``device`` (a no-op on the CPU)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()
    elif dev.type == "xpu":
        torch.xpu.synchronize(dev)


def reset_peak_memory(device: torch.device | str) -> None:
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def peak_memory(device: torch.device | str) -> dict[str, Any]:
    """Peak device memory since the last reset (bytes); on the CPU only the process's lifetime peak RSS."""
    dev = torch.device(device)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    if dev.type == "cuda":
        return {
            "allocated_bytes": int(torch.cuda.max_memory_allocated(dev)),
            "reserved_bytes": int(torch.cuda.max_memory_reserved(dev)),
            "process_max_rss_bytes": rss,
        }
    return {"allocated_bytes": None, "reserved_bytes": None, "process_max_rss_bytes": rss}


def environment_info(device: torch.device | str) -> dict[str, Any]:
    """Device name and UUID, library versions, git commit and the code's hash, for the cell's record (step 1)."""
    dev = torch.device(device)
    info: dict[str, Any] = {
        "device": str(dev),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "host_cpu": platform.processor() or platform.machine(),
        "git_commit": git_commit(),
        "code_hash": code_hash(),
    }
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        info["gpu_name"] = torch.cuda.get_device_name(index)
        info["gpu_uuid"] = cuda_uuid(torch.device("cuda", index))
        info["cuda"] = torch.version.cuda
        try:
            import pynvml  # noqa: PLC0415 - CUDA devices only (the driver version), as in energy.NvmlMeter

            pynvml.nvmlInit()
            driver = pynvml.nvmlSystemGetDriverVersion()
            info["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        except Exception:  # noqa: BLE001 - the record says it is missing
            info["driver"] = None
    return info


UNKNOWN_COMMIT = "unknown"
DIRTY_SUFFIX = "+dirty"
CODE_HASH_PREFIX = "sha256:"
# the project's own files: HEAD must track them for its commit to name the code (not an enclosing repository's)
PROJECT_MARKERS = ("pyproject.toml", "pipeline/device.py")


def _git(*args: str) -> subprocess.CompletedProcess[str] | None:
    """``git`` in the project root without taking the index lock (a read must not write), or None if it cannot run."""
    try:
        return subprocess.run(
            ["git", "--no-optional-locks", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit() -> str:
    """The commit of the code that runs: HEAD when it names that code, ``<HEAD>+dirty`` when it does not, or
    ``unknown`` outside the project's own checkout.

    HEAD names the code only when (1) git's top level is the project root (a copy of the project folder inside
    another repository must not record that repository's commit), (2) HEAD tracks the project's own files (a copy
    put at the root of another repository is not that repository's commit) and (3) the tracked tree is unchanged
    and ``pipeline/`` holds no untracked file (a working tree with edits after HEAD, as a device copy carries, ran
    other code). Case (3) records ``<HEAD>+dirty``; ``code_hash`` (beside it in ``environment_info``) then names the
    code. Cases (1) and (2) record ``unknown``."""
    out = _git("rev-parse", "--show-toplevel", "HEAD")
    if out is None:
        return UNKNOWN_COMMIT
    lines = out.stdout.split("\n")
    if out.returncode != 0 or len(lines) < 2 or not lines[1].strip():
        return UNKNOWN_COMMIT
    try:
        own = Path(lines[0]).resolve() == REPO_ROOT.resolve()
    except OSError:
        return UNKNOWN_COMMIT
    head = lines[1].strip()
    if not own:
        return UNKNOWN_COMMIT
    tracked = _git("ls-tree", "--name-only", "-r", "HEAD", "--", *PROJECT_MARKERS)
    if tracked is None or tracked.returncode != 0 or set(tracked.stdout.split()) != set(PROJECT_MARKERS):
        return UNKNOWN_COMMIT
    changed = _git("status", "--porcelain", "--untracked-files=no")
    # bytecode caches are not code (code_hash skips them too), with or without a .gitignore saying so
    untracked = _git(
        "status", "--porcelain", "--untracked-files=all", "--", "pipeline", ":(exclude,glob)**/__pycache__/**"
    )
    if changed is None or untracked is None or changed.returncode != 0 or untracked.returncode != 0:
        return UNKNOWN_COMMIT
    if changed.stdout.strip() or untracked.stdout.strip():
        return head + DIRTY_SUFFIX
    return head


def code_hash(root: Path | None = None) -> str:
    """``sha256:<hex>`` over the relative paths and bytes of every file under ``pipeline/`` (bytecode caches
    aside): names the code that ran where the commit cannot (``+dirty``, ``unknown``)."""
    base = (root or REPO_ROOT) / "pipeline"
    digest = hashlib.sha256()
    try:
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(base)
            if "__pycache__" in rel.parts or path.suffix == ".pyc" or not path.is_file():
                continue
            digest.update(rel.as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    except OSError:
        return UNKNOWN_COMMIT
    return CODE_HASH_PREFIX + digest.hexdigest()


def machine_info(device: torch.device | str) -> dict[str, Any]:
    """``environment_info`` plus what a benchmark reports about the host (platform, cores, threads)."""
    info = environment_info(device)
    info.update(
        platform=platform.platform(),
        cpu_count=os.cpu_count(),
        torch_threads=torch.get_num_threads(),
    )
    return info
