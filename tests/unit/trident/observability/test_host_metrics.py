"""Host gauges: real /proc readings for the CPU; NVML through a stand-in device table.

The NVML stand-in is a plain object with the pynvml functions trident calls (no GPU exists on
CI machines); real GPUs are checked on the lent GPU machine.
"""

import logging
from types import SimpleNamespace

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from trident.observability.host_metrics import CpuMetrics, GpuMetrics
from trident.observability.metrics import exposition


def scrape(*collectors):
    reg = CollectorRegistry(auto_describe=False)
    for c in collectors:
        reg.register(c)
    return {f.name: f for f in text_string_to_metric_families(exposition(reg).decode())}


def test_cpu_metrics_from_proc():
    cpu = CpuMetrics()
    cpu.poll()
    sum(i * i for i in range(200_000))  # some CPU time between the two readings
    cpu.poll()
    fams = scrape(cpu)
    assert 0.0 <= fams["nv_cpu_utilization"].samples[0].value <= 1.0
    total = fams["nv_cpu_memory_total_bytes"].samples[0].value
    used = fams["nv_cpu_memory_used_bytes"].samples[0].value
    assert total > 0 and 0 < used < total


class FakeNvml:
    def __init__(self, count=2, fail_init=False):
        self.count, self.fail_init, self.energy = count, fail_init, 1000

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}".encode()

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=50 + h)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=80 << 30, used=(h + 1) << 30)

    def nvmlDeviceGetPowerUsage(self, h):
        return 250_500

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        raise RuntimeError("Not Supported")

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.energy += 2500
        return self.energy


def test_gpu_families_with_uuid_labels(caplog):
    nvml = FakeNvml()
    gpu = GpuMetrics(nvml)
    with caplog.at_level(logging.WARNING, logger="trident.metrics"):
        gpu.poll()
        gpu.poll()
    fams = scrape(gpu)
    util = {s.labels["gpu_uuid"]: s.value for s in fams["nv_gpu_utilization"].samples}
    assert util == {"GPU-0": 0.5, "GPU-1": 0.51}
    assert fams["nv_gpu_memory_used_bytes"].samples[1].value == 2 << 30
    assert fams["nv_gpu_power_usage"].samples[0].value == 250.5
    energy = {s.labels["gpu_uuid"]: s.value for s in fams["nv_energy_consumption"].samples}
    assert energy["GPU-0"] == 5.0  # joules since the first reading
    # an unsupported field is logged once per GPU, not on every poll
    assert sum("power_limit" in r.getMessage() for r in caplog.records) == 2


def test_no_nvml_means_no_gpu_families():
    for gpu in (GpuMetrics(FakeNvml(fail_init=True)), GpuMetrics(FakeNvml(count=0))):
        assert not gpu.available and gpu.reason
        assert scrape(gpu) == {}
