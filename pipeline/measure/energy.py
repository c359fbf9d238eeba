"""Energy meters for the measurement window (docs/DESIGN.md section 5, item 7).

By availability, for the device a cell runs on:

1. ``NvmlMeter``: the NVML total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since
   driver load, Volta and later) of the cell's own GPU, found by UUID so that ``CUDA_VISIBLE_DEVICES``
   remapping cannot point it at a neighbour; a 10 Hz power poller runs alongside and its integral
   is reported as a cross-check. Where the counter is not supported, the poller's integral is the
   figure and the meter says so (``method``).
2. ``RaplMeter``: Intel/AMD RAPL package energy from ``/sys/class/powercap`` where readable (CPU runs).
3. ``NullMeter``: energy recorded as unavailable with the reason. Never an estimate.

Besides, by name: ``ZeusMeter`` (``zeus``), Zeus's ``ZeusMonitor`` (ml-energy/zeus, the meter behind the
ML.ENERGY leaderboard) on the cell's GPU, and ``PairedMeter`` (``nvml+zeus``, or any ``<meter>+<meter>``):
two meters on the same windows, the first's reading the figure and the second's kept beside it
(``EnergyReading.reference``), with their difference in ``energy_summary``: our meter against the field's.

Every meter: ``start()`` then ``stop() -> EnergyReading`` around the window (the caller synchronises
the device first), and ``measure_idle(seconds)`` for the idle power with models resident, from which
``energy_summary`` derives the idle-subtracted ("dynamic") figures.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.device import cuda_uuid
from pipeline.measure.meters import (
    POLL_HZ,
    ZEUS_FIX,
    EnergyMeter,
    EnergyReading,
    IdleReading,
    NullMeter,
    NvmlMeter,
    PairedMeter,
    RaplMeter,
    ZeusMeter,
    rapl_packages,
)


def make_energy_meter(device: Any = None, kind: str = "auto", poll_hz: float = POLL_HZ) -> EnergyMeter:
    """The best meter for ``device`` (a torch device or string), or a NullMeter saying why none.

    ``kind``: ``auto`` (NVML for CUDA devices, RAPL for the CPU), ``nvml``, ``rapl``, ``zeus``, ``none``, or
    ``<a>+<b>`` (``nvml+zeus``): meter ``a`` with meter ``b`` beside it on the same windows (``PairedMeter``).
    """
    check_energy_meter(kind)
    if "+" in kind:
        primary, reference = kind.split("+")
        return PairedMeter(make_energy_meter(device, primary, poll_hz), make_energy_meter(device, reference, poll_hz))
    if kind == "zeus":
        return _zeus_meter(device)
    if kind == "none":
        return NullMeter("energy measurement switched off")
    dev_type = "cpu"
    if device is not None:
        dev_type = torch.device(device).type
    if kind == "nvml" or (kind == "auto" and dev_type == "cuda"):
        if dev_type != "cuda":
            return NullMeter(f"NVML meter asked for a {dev_type} device")
        try:
            uuid = cuda_uuid(device)
            if uuid is None:
                return NullMeter("no CUDA device visible")
            meter = NvmlMeter(uuid, poll_hz)
            return meter if meter.available else NullMeter(meter.reason or "NVML unavailable")
        except Exception as err:  # noqa: BLE001 - no driver, no library, unknown UUID
            return NullMeter(f"NVML unavailable: {type(err).__name__}: {err}")
    if kind == "rapl" or (kind == "auto" and dev_type == "cpu"):
        rapl = RaplMeter(rapl_packages())
        return rapl if rapl.available else NullMeter(rapl.reason or "RAPL unavailable")
    return NullMeter(f"no energy meter for device type {dev_type!r}")


ENERGY_METERS = ("auto", "nvml", "rapl", "zeus", "none")


def check_energy_meter(kind: Any) -> None:
    """ValueError naming the valid values unless ``kind`` is a meter name or ``<a>+<b>`` of two distinct ones."""
    parts = str(kind).split("+")
    if (
        not isinstance(kind, str)
        or len(parts) > 2
        or any(p not in ENERGY_METERS for p in parts)
        or (len(parts) == 2 and (parts[0] == parts[1] or "none" in parts))
    ):
        raise ValueError(
            f"unknown energy meter {kind!r}; valid: {', '.join(ENERGY_METERS)}, or two of auto/nvml/rapl/zeus "
            "joined by '+' (the first is the figure, the second a reference on the same windows: nvml+zeus)"
        )


def _zeus_meter(device: Any) -> EnergyMeter:
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda" or not torch.cuda.is_available():
        return NullMeter(f"the Zeus meter measures CUDA GPUs; this cell runs on {dev.type}")
    try:
        meter = ZeusMeter(dev.index if dev.index is not None else torch.cuda.current_device())
    except ImportError as err:
        return NullMeter(f"Zeus is not installed ({err}): {ZEUS_FIX}")
    except Exception as err:  # noqa: BLE001 - no driver, a GPU Zeus cannot open
        return NullMeter(f"Zeus unavailable: {type(err).__name__}: {err}")
    return meter if meter.available else NullMeter(meter.reason or "Zeus unavailable")


def energy_summary(reading: EnergyReading, idle: IdleReading | None, tokens: int) -> dict[str, Any]:
    """J/token (total board energy / tokens) and the idle-subtracted ("dynamic") figures; None where unknown."""
    out: dict[str, Any] = {
        "energy_available": reading.available,
        "energy_j": reading.energy_j,
        "energy_method": reading.method,
        "energy_unavailable_reason": reading.reason,
        "j_per_token": None,
        "idle_power_w": idle.power_w if idle is not None and idle.available else None,
        "dynamic_energy_j": None,
        "dynamic_j_per_token": None,
        "poller_energy_j": reading.poller_energy_j,
    }
    if reading.energy_j is not None and tokens > 0:
        out["j_per_token"] = reading.energy_j / tokens
    if reading.energy_j is not None and out["idle_power_w"] is not None:
        out["dynamic_energy_j"] = reading.energy_j - out["idle_power_w"] * reading.duration_s
        if tokens > 0:
            out["dynamic_j_per_token"] = out["dynamic_energy_j"] / tokens
    ref = reading.reference
    if ref is not None:  # a second meter on the same window: its figures and ours against it
        ref_j = ref.get("energy_j")
        out["reference_meter"] = ref.get("meter")
        out["reference_energy_j"] = ref_j
        out["reference_j_per_token"] = ref_j / tokens if ref_j is not None and tokens > 0 else None
        out["energy_vs_reference"] = reading.energy_j / ref_j - 1.0 if reading.energy_j is not None and ref_j else None
        # the reference's window holds ours (it starts first and stops last), so its energy includes those extra
        # milliseconds; mean power over each meter's own window compares the two meters without them
        ref_s = ref.get("duration_s")
        out["reference_duration_s"] = ref_s
        out["duration_s"] = reading.duration_s
        out["power_vs_reference"] = (
            (reading.energy_j / reading.duration_s) / (ref_j / ref_s) - 1.0
            if reading.energy_j is not None and ref_j and ref_s and reading.duration_s > 0
            else None
        )
        out["reference_idle_power_w"] = idle.reference_power_w if idle is not None else None
    return out
