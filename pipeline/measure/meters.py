"""The energy meters themselves: readings, the meter interface, NVML, RAPL, Zeus, a paired meter and no meter.

Which one a cell gets, and the summary of a reading, are ``pipeline.measure.energy`` (its docstring describes the
meters and their order of preference).
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Sequence

POLL_HZ = 10.0
IDLE_SECONDS = 10.0


@dataclass
class EnergyReading:
    """Energy over one window. ``energy_j`` is None exactly when ``available`` is False."""

    meter: str
    available: bool
    energy_j: float | None = None
    duration_s: float = 0.0
    method: str | None = None  # "counter", "power-poller", "rapl"
    reason: str | None = None  # why unavailable
    poller_energy_j: float | None = None
    poller_samples: int = 0
    poller_mean_power_w: float | None = None
    poller_max_gap_s: float | None = None
    device: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] | None = None  # a second meter's reading of the same window (PairedMeter)

    @property
    def mean_power_w(self) -> float | None:
        if self.energy_j is None or self.duration_s <= 0:
            return None
        return self.energy_j / self.duration_s

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["mean_power_w"] = self.mean_power_w
        return out


@dataclass
class IdleReading:
    """Idle power with the models resident (board power, no work submitted)."""

    available: bool
    power_w: float | None = None
    seconds: float = 0.0
    method: str | None = None
    reason: str | None = None
    reference_power_w: float | None = None  # a second meter's idle power over the same seconds (PairedMeter)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EnergyMeter:
    """Base class: one window at a time."""

    name = "none"
    available = False
    reason: str | None = None

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> EnergyReading:
        raise NotImplementedError

    def measure_idle(self, seconds: float = IDLE_SECONDS) -> IdleReading:
        """Average power over ``seconds`` of idling (the caller has synchronised the device)."""
        if not self.available:
            return IdleReading(False, reason=self.reason)
        self.start()
        time.sleep(seconds)
        reading = self.stop()
        if reading.energy_j is None:
            return IdleReading(False, seconds=reading.duration_s, reason=reading.reason)
        ref = reading.reference or {}
        ref_w = (
            ref["energy_j"] / ref["duration_s"] if ref.get("energy_j") is not None and ref.get("duration_s") else None
        )
        return IdleReading(
            True, reading.energy_j / reading.duration_s, reading.duration_s, reading.method, reference_power_w=ref_w
        )

    def info(self) -> dict[str, Any]:
        return {"meter": self.name, "available": self.available, "reason": self.reason}

    def close(self) -> None:
        pass

    def __enter__(self) -> "EnergyMeter":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.last = self.stop()


class NullMeter(EnergyMeter):
    """No meter for this device: every reading says so, with the reason."""

    def __init__(self, reason: str):
        self.reason = reason
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> EnergyReading:
        duration = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        return EnergyReading(meter="none", available=False, duration_s=duration, reason=self.reason)


# --------------------------------------------------------------------------- NVML


class _PowerPoller(threading.Thread):
    """Samples board power at ``hz`` into ``(perf_counter, watts)`` pairs until stopped."""

    def __init__(self, read_watts, hz: float):
        super().__init__(daemon=True, name="nvml-power-poller")
        self.read_watts, self.period = read_watts, 1.0 / hz
        self.samples: list[tuple[float, float]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        next_t = time.perf_counter()
        while not self._stop_event.is_set():
            try:
                self.samples.append((time.perf_counter(), self.read_watts()))
            except Exception:  # noqa: BLE001 - a failed sample is a gap, visible in max_gap
                pass
            next_t += self.period
            self._stop_event.wait(max(0.0, next_t - time.perf_counter()))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def integrate_power(samples: Sequence[tuple[float, float]], t0: float, t1: float) -> tuple[float | None, float | None]:
    """Trapezoidal energy (J) of ``(t, W)`` samples over ``[t0, t1]`` (held flat to the bounds), max gap (s)."""
    pts = sorted((t, w) for t, w in samples if t0 <= t <= t1)
    if not pts:
        return None, None
    pts = [(t0, pts[0][1])] + pts + [(t1, pts[-1][1])]
    energy = sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(pts, pts[1:]))
    gap = max(b[0] - a[0] for a, b in zip(pts, pts[1:]))
    return energy, gap


class NvmlMeter(EnergyMeter):
    """NVML energy counter of one GPU (by UUID) with a power poller as cross-check."""

    name = "nvml"

    def __init__(self, uuid: str, poll_hz: float = POLL_HZ):
        import pynvml  # noqa: PLC0415 - GPUs only, and read at call time so that the tests' fake NVML (sys.modules) is the one used

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.uuid, self.poll_hz = uuid, poll_hz
        self.handle, self.mig_note = self._handle(uuid)
        self.device_info: dict[str, Any] = {
            "uuid": uuid,
            "name": _text(pynvml.nvmlDeviceGetName(self.handle)),
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
        }
        if self.mig_note:
            self.device_info["note"] = self.mig_note
        self.counter_ok = self._try(lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)) is not None
        self.power_field = self._pick_power_field()
        self.device_info["power_field"] = self.power_field
        self.available = self.counter_ok or self.power_field is not None
        self.reason = None if self.available else "NVML reports neither the energy counter nor board power for this GPU"
        self._poller: _PowerPoller | None = None

    def _handle(self, uuid: str):
        pynvml = self.nvml
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)
        if uuid.startswith("MIG-"):
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            return parent, "MIG instance: figures are the whole board's, shared with other instances"
        return handle, None

    @staticmethod
    def _try(fn):
        try:
            return fn()
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends
            return None

    def _instant_power_w(self) -> float:
        value = self.nvml.nvmlDeviceGetFieldValues(self.handle, [self.nvml.NVML_FI_DEV_POWER_INSTANT])[0]
        if value.nvmlReturn != 0:
            raise RuntimeError("instant power not available")
        return value.value.uiVal / 1000.0

    def _average_power_w(self) -> float:
        return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0

    def _pick_power_field(self) -> str | None:
        # Instant power where the driver has it: nvmlDeviceGetPowerUsage is a 1 s moving average on
        # Ampere and later, which smears a short window.
        if hasattr(self.nvml, "NVML_FI_DEV_POWER_INSTANT") and self._try(self._instant_power_w):
            return "instant"
        if self._try(self._average_power_w) is not None:
            return "average"
        return None

    def read_watts(self) -> float:
        return self._instant_power_w() if self.power_field == "instant" else self._average_power_w()

    def start(self) -> None:
        if self.power_field is not None:
            self._poller = _PowerPoller(self.read_watts, self.poll_hz)
            self._poller.start()
        self._e0 = (
            self._try(lambda: self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)) if self.counter_ok else None
        )
        self._t0 = time.perf_counter()

    def stop(self) -> EnergyReading:
        t1 = time.perf_counter()
        e1 = self._try(lambda: self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)) if self.counter_ok else None
        samples: list[tuple[float, float]] = []
        if self._poller is not None:
            self._poller.stop()
            samples, self._poller = self._poller.samples, None
        duration = t1 - self._t0
        poller_j, gap = integrate_power(samples, self._t0, t1)
        in_window = [w for t, w in samples if self._t0 <= t <= t1]
        counter_j = (e1 - self._e0) / 1000.0 if (e1 is not None and self._e0 is not None) else None
        if counter_j is not None:
            energy, method = counter_j, "counter"
        elif poller_j is not None:
            energy, method = poller_j, "power-poller"
        else:
            energy, method = None, None
        return EnergyReading(
            meter=self.name,
            available=energy is not None,
            energy_j=energy,
            duration_s=duration,
            method=method,
            reason=None if energy is not None else "no counter reading and no power sample in the window",
            poller_energy_j=poller_j,
            poller_samples=len(in_window),
            poller_mean_power_w=(sum(in_window) / len(in_window)) if in_window else None,
            poller_max_gap_s=gap,
            device=dict(self.device_info),
        )

    def info(self) -> dict[str, Any]:
        return {**super().info(), "counter": self.counter_ok, "poll_hz": self.poll_hz, **self.device_info}

    def close(self) -> None:
        self._try(self.nvml.nvmlShutdown)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- RAPL


RAPL_ROOT = Path("/sys/class/powercap")


def rapl_packages(root: Path | None = None) -> list[Path]:
    """Package-level RAPL zones (``intel-rapl:N`` named ``package-N``) whose counter is readable (under
    ``RAPL_ROOT``, read when called, without ``root``)."""
    root = RAPL_ROOT if root is None else root
    zones = []
    for zone in sorted(root.glob("intel-rapl:*")) if root.exists() else []:
        if zone.name.count(":") != 1:
            continue  # sub-zones (core, uncore, dram) are inside the package figure
        try:
            if (zone / "name").read_text().strip().startswith("package"):
                int((zone / "energy_uj").read_text())
                zones.append(zone)
        except (OSError, ValueError):
            continue
    return zones


class RaplMeter(EnergyMeter):
    """Sum of RAPL package counters (wrap-around handled); CPU package energy, not the whole machine."""

    name = "rapl"

    def __init__(self, zones: Sequence[Path]):
        self.zones = list(zones)
        self.available = bool(self.zones)
        self.reason = None if self.zones else "no readable RAPL package counter under /sys/class/powercap"
        self.max_range = [int((z / "max_energy_range_uj").read_text()) for z in self.zones]

    def _read(self) -> list[int]:
        return [int((z / "energy_uj").read_text()) for z in self.zones]

    def start(self) -> None:
        self._e0, self._t0 = self._read(), time.perf_counter()

    def stop(self) -> EnergyReading:
        e1, t1 = self._read(), time.perf_counter()
        total_uj = 0
        for a, b, rng in zip(self._e0, e1, self.max_range):
            total_uj += b - a if b >= a else b + rng - a  # at most one wrap in a window
        return EnergyReading(
            meter=self.name,
            available=True,
            energy_j=total_uj / 1e6,
            duration_s=t1 - self._t0,
            method="rapl",
            device={"zones": [z.name for z in self.zones]},
        )


# --------------------------------------------------------------------------- Zeus and pairs


ZEUS_FIX = (
    "install it with `pip install --no-deps zeus==0.16.0` (what `make setup` does; its needs but amdsmi are in "
    "requirements.lock: amdsmi without AMD's library breaks ray.init())"
)


class ZeusMeter(EnergyMeter):
    """Zeus's ``ZeusMonitor`` on one CUDA device (index as torch numbers it, ``CUDA_VISIBLE_DEVICES``
    applied, as Zeus takes it): the field's reference meter. Zeus reads the same driver counter as
    ``NvmlMeter`` on Volta and later and polls power in a process of its own on older GPUs; its code is
    not ours, which is the point of running it beside ours. The caller synchronises the device."""

    name = "zeus"

    def __init__(self, index: int, monitor: Any = None):
        if monitor is None:
            from zeus.monitor import ZeusMonitor  # noqa: PLC0415 - only when asked for, GPU runs

            monitor = ZeusMonitor(gpu_indices=[index], cpu_indices=[])
        self.index, self.monitor = int(index), monitor
        self.available = self.index in list(getattr(monitor, "gpu_indices", [self.index]))
        self.reason = None if self.available else f"Zeus does not see CUDA device {self.index}"
        self._windows = 0
        self._key: str | None = None

    def start(self) -> None:
        self._windows += 1
        self._key = f"pipeline-{self._windows}"
        self.monitor.begin_window(self._key, sync_execution=False)

    def stop(self) -> EnergyReading:
        measurement = self.monitor.end_window(self._key, sync_execution=False)
        energy = measurement.gpu_energy.get(self.index)
        return EnergyReading(
            meter=self.name,
            available=energy is not None,
            energy_j=None if energy is None else float(energy),
            duration_s=float(measurement.time),
            method="zeus" if energy is not None else None,
            reason=None if energy is not None else f"Zeus measured no energy for CUDA device {self.index}",
            device={"index": self.index, "zeus": _zeus_version()},
        )

    def info(self) -> dict[str, Any]:
        return {**super().info(), "index": self.index, "zeus": _zeus_version()}


def _zeus_version() -> str | None:
    try:
        return version("zeus")
    except PackageNotFoundError:
        return None


class PairedMeter(EnergyMeter):
    """Two meters on the same windows: ``primary``'s reading is the figure, ``reference``'s rides along
    (``EnergyReading.reference``; ``energy_summary`` adds ``reference_energy_j`` and ``energy_vs_reference``).
    The reference starts first and stops last, so its window holds the primary's (microseconds apart)."""

    def __init__(self, primary: EnergyMeter, reference: EnergyMeter):
        self.primary, self.reference = primary, reference
        self.name = f"{primary.name}+{reference.name}"
        self.available, self.reason = primary.available, primary.reason

    def start(self) -> None:
        self.reference.start()
        self.primary.start()

    def stop(self) -> EnergyReading:
        reading = self.primary.stop()
        reading.reference = self.reference.stop().to_dict()
        return reading

    def info(self) -> dict[str, Any]:
        return {
            "meter": self.name,
            "available": self.available,
            "reason": self.reason,
            "primary": self.primary.info(),
            "reference": self.reference.info(),
        }

    def close(self) -> None:
        self.primary.close()
        self.reference.close()
