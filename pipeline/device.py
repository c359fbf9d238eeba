"""The device and the machine: synchronisation, peak memory, machine and library info, git commit.

The one implementation used by the measurement window (``pipeline.measure.window``), the step-cost probe
(``pipeline.measure.costs``) and the benchmark (``pipeline.bench``).
"""

from __future__ import annotations

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
    """Device name and UUID, library versions and git commit, for the cell's record (step 1)."""
    dev = torch.device(device)
    info: dict[str, Any] = {
        "device": str(dev),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "host_cpu": platform.processor() or platform.machine(),
        "git_commit": git_commit(),
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


def git_commit() -> str:
    """The project's HEAD commit, or ``unknown`` outside the project's own git checkout: a copy of the project
    folder (no ``.git``) inside another repository must not record that repository's commit, so git's top level
    has to be the project root (the folder holding ``pipeline/`` and ``pyproject.toml``)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN_COMMIT
    lines = out.stdout.split("\n")
    if out.returncode != 0 or len(lines) < 2 or not lines[1].strip():
        return UNKNOWN_COMMIT
    try:
        own = Path(lines[0]).resolve() == REPO_ROOT.resolve()
    except OSError:
        return UNKNOWN_COMMIT
    return lines[1].strip() if own else UNKNOWN_COMMIT


def machine_info(device: torch.device | str) -> dict[str, Any]:
    """``environment_info`` plus what a benchmark reports about the host (platform, cores, threads)."""
    info = environment_info(device)
    info.update(
        platform=platform.platform(),
        cpu_count=os.cpu_count(),
        torch_threads=torch.get_num_threads(),
    )
    return info
