"""Energy meters: unavailable without a meter (and everything else works), RAPL arithmetic, the power
integral and poller, NVML logic against a stand-in driver, and the real NVML path on a GPU."""

from __future__ import annotations

import time
import types

import pytest
import torch

from pipeline import energy


def test_cpu_without_rapl_records_unavailable(monkeypatch, tmp_path):
    monkeypatch.setattr(energy, "RAPL_ROOT", tmp_path)  # an empty powercap tree
    meter = energy.make_energy_meter("cpu")
    assert isinstance(meter, energy.NullMeter) and not meter.available
    meter.start()
    time.sleep(0.01)
    reading = meter.stop()
    assert reading.available is False and reading.energy_j is None and reading.reason
    assert reading.duration_s > 0
    idle = meter.measure_idle(5.0)  # returns at once: nothing to measure
    assert idle.available is False and idle.power_w is None
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
    zones = energy.rapl_packages(tmp_path)
    assert zones == [zone]  # the core sub-zone is not double counted
    meter = energy.RaplMeter(zones)
    meter.start()
    (zone / "energy_uj").write_text("100\n")  # wrapped: 900 -> 1000 -> 100
    reading = meter.stop()
    assert reading.available and reading.method == "rapl"
    assert reading.energy_j == pytest.approx(200e-6)


def test_integrate_power():
    samples = [(0.1 * i, 100.0) for i in range(1, 20)]
    e, gap = energy.integrate_power(samples, 0.0, 2.0)
    assert e == pytest.approx(200.0) and gap == pytest.approx(0.1)
    ramp = [(0.0, 0.0), (1.0, 100.0)]
    assert energy.integrate_power(ramp, 0.0, 1.0)[0] == pytest.approx(50.0)
    assert energy.integrate_power([], 0.0, 1.0) == (None, None)


def test_poller_samples_at_about_10_hz():
    poller = energy._PowerPoller(lambda: 42.0, hz=10.0)
    poller.start()
    time.sleep(0.55)
    poller.stop()
    assert 4 <= len(poller.samples) <= 8
    assert all(w == 42.0 for _, w in poller.samples)


class _FakeNvml(types.SimpleNamespace):
    """Stand-in for the NVML library (no NVIDIA driver here): a board drawing 250 W."""

    NVML_FI_DEV_POWER_INSTANT = 186

    def __init__(self, counter: bool = True, instant: bool = True):
        super().__init__()
        self.t0, self.counter, self.instant = time.perf_counter(), counter, instant
        self.asked_uuid = None

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
        return int((time.perf_counter() - self.t0) * 250.0 * 1000)  # mJ

    def nvmlDeviceGetFieldValues(self, h, ids):
        value = types.SimpleNamespace(nvmlReturn=0 if self.instant else 3, value=types.SimpleNamespace(uiVal=250_000))
        return [value]

    def nvmlDeviceGetPowerUsage(self, h):
        return 250_000


@pytest.mark.parametrize("counter, instant, method, field", [
    (True, True, "counter", "instant"),
    (False, True, "power-poller", "instant"),
    (True, False, "counter", "average"),
])
def test_nvml_meter_logic(monkeypatch, counter, instant, method, field):
    fake = _FakeNvml(counter=counter, instant=instant)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    meter = energy.NvmlMeter("GPU-1234", poll_hz=20)
    assert fake.asked_uuid == b"GPU-1234" and meter.power_field == field
    meter.start()
    time.sleep(0.3)
    reading = meter.stop()
    assert reading.available and reading.method == method
    assert reading.energy_j == pytest.approx(250.0 * reading.duration_s, rel=0.1)
    assert reading.poller_energy_j == pytest.approx(250.0 * reading.duration_s, rel=1e-6)
    assert reading.poller_samples >= 3 and reading.device["name"] == "Fake GPU"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_nvml_counter_and_poller_agree_on_a_gpu():
    device = torch.device("cuda")
    meter = energy.make_energy_meter(device)
    assert isinstance(meter, energy.NvmlMeter), meter.reason
    a = torch.randn(8192, 8192, device=device)
    torch.cuda.synchronize()
    meter.start()
    end = time.perf_counter() + 3.0
    while time.perf_counter() < end:
        a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    reading = meter.stop()
    idle = meter.measure_idle(2.0)
    print("NVML window:", reading.to_dict(), "idle:", idle.to_dict())
    assert reading.method == "counter" and reading.energy_j > 0
    assert reading.poller_samples >= 25
    assert reading.poller_energy_j == pytest.approx(reading.energy_j, rel=0.2)
    assert idle.available and 0 < idle.power_w < reading.mean_power_w
