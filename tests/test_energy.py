"""Energy meters: unavailable without a meter (and everything else works), RAPL arithmetic, the power
integral and poller, NVML logic against a stand-in driver, and the real NVML path on a GPU.

The meters' clock is injected (``clock``: ``meters.time`` replaced by a clock that moves only when the test sleeps),
so energies, durations and the poller's schedule are exact whatever else the machine runs; the GPU tests alone
read real time.
"""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest
import torch
from zeus.monitor import ZeusMonitor
from zeus.monitor.energy import Measurement

from pipeline.measure import energy, meters


class _Clock:
    """The meters' ``time``: ``perf_counter`` reads a value that only ``sleep`` moves. ``sleep`` then waits until
    every watched stand-in board has been read at the new time (its meter's poller thread took a sample), so a
    window holds a sample however slowly the machine schedules the poller."""

    def __init__(self):
        self.now = 1000.0
        self.changed = threading.Condition()
        self.boards: list[_FakeNvml] = []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self.changed:
            self.now += seconds
            polled = [b for b in self.boards if b.polled]
            read = self.changed.wait_for(lambda: all(b.read_at >= self.now for b in polled), timeout=60)
        assert read, "a meter's poller took no sample in 60 s"

    def read(self, board: _FakeNvml) -> None:
        with self.changed:
            board.read_at = self.now
            self.changed.notify_all()


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(meters, "time", types.SimpleNamespace(perf_counter=fake.perf_counter, sleep=fake.sleep))
    return fake


def test_cpu_without_rapl_records_unavailable(monkeypatch, tmp_path, clock):
    monkeypatch.setattr(meters, "RAPL_ROOT", tmp_path)  # an empty powercap tree
    meter = energy.make_energy_meter("cpu")
    assert isinstance(meter, meters.NullMeter) and not meter.available
    meter.start()
    clock.sleep(0.25)
    reading = meter.stop()
    assert reading.available is False and reading.energy_j is None and reading.reason
    assert reading.duration_s == pytest.approx(0.25)
    before = clock.now
    idle = meter.measure_idle(5.0)  # returns at once: nothing to measure
    assert idle.available is False and idle.power_w is None and clock.now == before
    summary = energy.energy_summary(reading, idle, tokens=100)
    assert summary["j_per_token"] is None and summary["dynamic_j_per_token"] is None
    assert summary["energy_available"] is False and summary["energy_unavailable_reason"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_cuda_device_without_gpu_records_unavailable():
    meter = energy.make_energy_meter("cuda")
    assert not meter.available and ("CUDA" in meter.reason or "NVML" in meter.reason)
    assert not energy.make_energy_meter("cpu", kind="nvml").available


def test_none_and_unknown_kinds():
    assert energy.make_energy_meter("cpu", kind="none").reason == "energy measurement switched off"
    with pytest.raises(ValueError, match="unknown energy meter"):
        energy.make_energy_meter("cpu", kind="smi")


def _fake_rapl(root, energy_uj: int, max_range: int = 1000):
    zone = root / "intel-rapl:0"
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_range}\n")
    sub = root / "intel-rapl:0:0"
    sub.mkdir(exist_ok=True)
    (sub / "name").write_text("core\n")
    (sub / "energy_uj").write_text("5\n")
    return zone


def test_rapl_counter_and_wraparound(tmp_path):
    zone = _fake_rapl(tmp_path, 900, max_range=1000)
    zones = meters.rapl_packages(tmp_path)
    assert zones == [zone]  # the core sub-zone is not double counted
    meter = meters.RaplMeter(zones)
    meter.start()
    (zone / "energy_uj").write_text("100\n")  # wrapped: 900 -> 1000 -> 100
    reading = meter.stop()
    assert reading.available and reading.method == "rapl"
    assert reading.energy_j == pytest.approx(200e-6)


def test_integrate_power():
    samples = [(0.1 * i, 100.0) for i in range(1, 20)]
    e, gap = meters.integrate_power(samples, 0.0, 2.0)
    assert e == pytest.approx(200.0) and gap == pytest.approx(0.1)
    ramp = [(0.0, 0.0), (1.0, 100.0)]
    assert meters.integrate_power(ramp, 0.0, 1.0)[0] == pytest.approx(50.0)
    assert meters.integrate_power([], 0.0, 1.0) == (None, None)


class _CountedStop:
    """The poller's stop event, for a poller run in the test's own thread: a wait moves the clock by its timeout,
    and the event is set once ``samples`` samples are taken."""

    def __init__(self, clock: _Clock, poller: meters._PowerPoller, samples: int):
        self.clock, self.poller, self.samples = clock, poller, samples

    def is_set(self) -> bool:
        return len(self.poller.samples) >= self.samples

    def wait(self, timeout: float) -> bool:
        self.clock.now += timeout
        return self.is_set()


def test_poller_samples_at_10_hz_on_its_schedule(clock):
    """One sample every 1/hz of the clock from the first, and a slow read (30 ms here) does not push the schedule
    back: the poller waits for the next tick, not a full period after the read."""

    def slow_read() -> float:
        clock.now += 0.03
        return 42.0

    poller = meters._PowerPoller(slow_read, hz=10.0)
    poller._stop_event = _CountedStop(clock, poller, samples=6)  # type: ignore[assignment]
    start = clock.now
    poller.run()  # in this thread: no scheduling of a real one
    assert [round(t - start, 9) for t, _ in poller.samples] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    assert all(w == 42.0 for _, w in poller.samples)


class _FakeNvml(types.SimpleNamespace):
    """Stand-in for the NVML library (no NVIDIA driver here): a board drawing 250 W."""

    NVML_FI_DEV_POWER_INSTANT = 186

    def __init__(self, clock: _Clock, counter: bool = True, instant: bool = True, watts: float = 250.0):
        super().__init__()
        self.clock, self.t0, self.counter, self.instant, self.watts = clock, clock.now, counter, instant, watts
        self.asked_uuid = None
        self.read_at = -1.0  # the clock when board power was last read
        clock.boards.append(self)

    @property
    def polled(self) -> bool:
        """Whether a meter's poller reads this board now (a thread of the poller's name is running)."""
        return any(t.name == "nvml-power-poller" and t.is_alive() for t in threading.enumerate())

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.asked_uuid = uuid
        return "handle"

    def nvmlDeviceGetName(self, h):
        return b"Fake GPU"

    def nvmlSystemGetDriverVersion(self):
        return "999.1"

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.counter:
            raise RuntimeError("NotSupported")
        return round((self.clock.now - self.t0) * self.watts * 1000)  # mJ

    def nvmlDeviceGetFieldValues(self, h, ids):
        self.clock.read(self)
        value = types.SimpleNamespace(
            nvmlReturn=0 if self.instant else 3, value=types.SimpleNamespace(uiVal=int(self.watts * 1000))
        )
        return [value]

    def nvmlDeviceGetPowerUsage(self, h):
        self.clock.read(self)
        return int(self.watts * 1000)


@pytest.mark.parametrize(
    "counter, instant, method, field",
    [
        (True, True, "counter", "instant"),
        (False, True, "power-poller", "instant"),
        (True, False, "counter", "average"),
    ],
)
def test_nvml_meter_logic(monkeypatch, clock, counter, instant, method, field):
    fake = _FakeNvml(clock, counter=counter, instant=instant)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    meter = meters.NvmlMeter("GPU-1234", poll_hz=20)
    assert fake.asked_uuid == b"GPU-1234" and meter.power_field == field
    meter.start()
    clock.sleep(0.3)
    reading = meter.stop()
    assert reading.available and reading.method == method and reading.duration_s == pytest.approx(0.3)
    assert reading.energy_j == pytest.approx(250.0 * 0.3)  # the counter's, else the poller's integral
    assert reading.poller_energy_j == pytest.approx(250.0 * 0.3)  # held flat from the window's first sample
    assert reading.poller_samples >= 1 and reading.device["name"] == "Fake GPU"


def _busy_window(meter: meters.EnergyMeter, device: torch.device, seconds: float = 3.0) -> meters.EnergyReading:
    """One metered window of back-to-back 8192^3 matrix products on ``device``."""
    a = torch.randn(8192, 8192, device=device)
    torch.cuda.synchronize()
    meter.start()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    return meter.stop()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_nvml_counter_and_poller_agree_on_a_gpu():
    device = torch.device("cuda")
    meter = energy.make_energy_meter(device)
    assert isinstance(meter, meters.NvmlMeter), meter.reason
    reading = _busy_window(meter, device)
    idle = meter.measure_idle(2.0)
    print("NVML window:", reading.to_dict(), "idle:", idle.to_dict())
    assert reading.method == "counter" and reading.energy_j > 0
    assert reading.poller_samples >= 25
    assert reading.poller_energy_j == pytest.approx(reading.energy_j, rel=0.2)
    assert idle.available and 0 < idle.power_w < reading.mean_power_w


def _nvml_meter(monkeypatch, clock: _Clock, watts: float) -> meters.NvmlMeter:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(clock, watts=watts))
    return meters.NvmlMeter("GPU-1234", poll_hz=20)


def test_a_paired_meter_reads_both_meters_on_the_same_windows(monkeypatch, clock):
    """Ours (a board at 250 W) with a reference beside it that reads 245 W: both figures, and ours 2% above it."""
    meter = meters.PairedMeter(_nvml_meter(monkeypatch, clock, 250.0), _nvml_meter(monkeypatch, clock, 245.0))
    assert meter.name == "nvml+nvml" and meter.available and meter.info()["reference"]["meter"] == "nvml"
    meter.start()
    clock.sleep(0.4)
    reading = meter.stop()
    assert reading.meter == "nvml" and reading.energy_j == pytest.approx(250.0 * 0.4)
    ref = reading.reference
    assert ref["meter"] == "nvml" and ref["energy_j"] == pytest.approx(245.0 * 0.4)
    assert ref["duration_s"] >= reading.duration_s  # the reference's window holds ours
    idle = meter.measure_idle(0.3)
    assert idle.power_w == pytest.approx(250.0) and idle.reference_power_w == pytest.approx(245.0)
    summary = energy.energy_summary(reading, idle, tokens=10)
    assert summary["reference_meter"] == "nvml" and summary["reference_energy_j"] == ref["energy_j"]
    assert summary["reference_j_per_token"] == pytest.approx(ref["energy_j"] / 10)
    # energies over the two windows (the reference's holds ours; on a real machine it can be tens of ms longer, so
    # the ratio of energies is not that of powers); mean powers over each meter's own window
    assert summary["energy_vs_reference"] == pytest.approx(reading.energy_j / ref["energy_j"] - 1.0)
    assert summary["power_vs_reference"] == pytest.approx(250.0 / 245.0 - 1.0)
    assert summary["reference_duration_s"] == ref["duration_s"] and summary["duration_s"] == reading.duration_s
    assert summary["reference_idle_power_w"] == idle.reference_power_w
    plain = energy.energy_summary(
        meters.EnergyReading(meter="nvml", available=True, energy_j=1.0, duration_s=1.0), None, tokens=10
    )
    assert "reference_meter" not in plain and plain["j_per_token"] == 0.1  # a single meter's summary is what it was


def test_energy_meter_names():
    for kind in ("auto", "nvml", "rapl", "zeus", "none", "nvml+zeus", "zeus+nvml", "auto+zeus"):
        energy.check_energy_meter(kind)
    for kind in ("smi", "nvml+nvml", "nvml+none", "nvml+zeus+rapl", 3, ""):
        with pytest.raises(ValueError, match="unknown energy meter .*nvml\\+zeus"):
            energy.check_energy_meter(kind)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_zeus_on_a_machine_without_a_gpu_says_why():
    meter = energy.make_energy_meter("cpu", kind="zeus")
    assert isinstance(meter, meters.NullMeter) and "CUDA" in meter.reason
    paired = energy.make_energy_meter("cpu", kind="auto+zeus")  # RAPL (or why not) with Zeus beside it
    assert isinstance(paired, meters.PairedMeter) and isinstance(paired.reference, meters.NullMeter)
    paired.start()
    reading = paired.stop()
    assert reading.reference["available"] is False and "CUDA" in reading.reference["reason"]
    # the real ZeusMonitor here: no GPU to watch, so a ZeusMeter on device 0 is unavailable and says so
    monitor = ZeusMonitor(gpu_indices=[], cpu_indices=[])
    assert not meters.ZeusMeter(0, monitor).available


class _Monitor:
    """ZeusMonitor's window interface, with Zeus's own Measurement, for a GPU this machine lacks."""

    gpu_indices = [1]

    def __init__(self, clock: _Clock):
        self.clock = clock
        self.open: dict[str, float] = {}

    def begin_window(self, key, sync_execution=True):
        assert key not in self.open and sync_execution is False  # the caller synchronises, as for our meters
        self.open[key] = self.clock.now

    def end_window(self, key, sync_execution=True):
        t = self.clock.now - self.open.pop(key)
        return Measurement(time=t, gpu_energy={1: 300.0 * t})


def test_zeus_meter_windows(clock):
    meter = meters.ZeusMeter(1, _Monitor(clock))
    for seconds in (0.05, 0.2):  # a fresh window name each time: Zeus refuses a name still open
        meter.start()
        clock.sleep(seconds)
        reading = meter.stop()
        assert reading.meter == "zeus" and reading.method == "zeus" and reading.available
        assert reading.duration_s == pytest.approx(seconds) and reading.device["index"] == 1
        assert reading.energy_j == pytest.approx(300.0 * seconds)
    assert reading.device["zeus"] == "0.16.0"
    assert not meters.ZeusMeter(0, _Monitor(clock)).available  # a device the monitor does not watch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_nvml_and_zeus_agree_on_a_gpu():
    """Our meter and Zeus's on the same 10-s window of matrix products: within 2% (the issue's goal), in energy and in
    mean power over each meter's own window. On an H200 (2026-11-26, benchmarks/gpu-random-llama3-8b-1b.md) a 3-s window
    read ours 3.3% under Zeus (1570.6 J vs 1623.5 J) while our poller read 0.7% under it: hence the longer window and
    the durations in the summary."""
    device = torch.device("cuda")
    meter = energy.make_energy_meter(device, "nvml+zeus")
    assert (
        isinstance(meter, meters.PairedMeter) and meter.available and isinstance(meter.reference, meters.ZeusMeter)
    ), meter.info()
    reading = _busy_window(meter, device, seconds=10.0)
    summary = energy.energy_summary(reading, meter.measure_idle(2.0), tokens=1)
    print("NVML vs Zeus:", summary)
    assert abs(summary["power_vs_reference"]) < 0.02
    assert abs(summary["energy_vs_reference"]) < 0.02
