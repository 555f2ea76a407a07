"""Host gauges polled at ``--metrics-interval-ms``: CPU (from /proc) and GPU (through pynvml).

CPU: ``nv_cpu_utilization`` (0..1 over the last interval), ``nv_cpu_memory_total_bytes``,
``nv_cpu_memory_used_bytes``. GPU, one series per device labelled ``gpu_uuid``:
``nv_gpu_utilization`` (0..1), ``nv_gpu_memory_total_bytes``, ``nv_gpu_memory_used_bytes``,
``nv_gpu_power_usage`` (W), ``nv_gpu_power_limit`` (W), ``nv_energy_consumption`` (J since the
server started). Without pynvml or a GPU the GPU families are absent and one log line says why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

import trident

log = logging.getLogger("trident.metrics")


def _read_cpu_times(path: str = "/proc/stat") -> tuple[int, int]:
    """(busy, total) jiffies summed over all CPUs."""
    with open(path) as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])
    return total - idle, total


def _read_memory(path: str = "/proc/meminfo") -> tuple[int, int]:
    """(total, used) bytes, used = MemTotal - MemAvailable."""
    values: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                values[key] = int(parts[0]) * 1024
    total = values.get("MemTotal", 0)
    return total, total - values.get("MemAvailable", values.get("MemFree", 0))


class CpuMetrics(Collector):
    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None
        self.utilization = 0.0
        self.memory_total = 0
        self.memory_used = 0
        self.available = True

    def poll(self) -> None:
        try:
            busy, total = _read_cpu_times()
            self.memory_total, self.memory_used = _read_memory()
        except (OSError, ValueError, IndexError) as e:
            if self.available:
                log.warning("CPU metrics unavailable: %s", e)
            self.available = False
            return
        if self._last is not None and total > self._last[1]:
            self.utilization = (busy - self._last[0]) / (total - self._last[1])
        self._last = (busy, total)

    def collect(self) -> Iterator[Any]:
        if not self.available:
            return
        yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=self.utilization)
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes",
                                value=self.memory_total)
        yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes",
                                value=self.memory_used)


@dataclass
class _Gpu:
    handle: Any
    uuid: str
    utilization: float = 0.0
    memory_total: int = 0
    memory_used: int = 0
    power_usage: float = 0.0
    power_limit: float = 0.0
    energy_start_mj: int | None = None
    energy_j: float = 0.0
    errors: set[str] = field(default_factory=set)


class GpuMetrics(Collector):
    """GPU gauges through NVML; inert (no families) when NVML or a GPU is missing."""

    def __init__(self, nvml: Any | None = None) -> None:
        self.gpus: list[_Gpu] = []
        self.reason = ""
        self._nvml = nvml
        if self._nvml is None:
            try:
                import pynvml  # type: ignore[import-not-found]

                self._nvml = pynvml
            except ImportError:
                self.reason = f'pynvml is not installed (pip install "{trident.DISTRIBUTION}[gpu]")'
                return
        try:
            self._nvml.nvmlInit()
            count = self._nvml.nvmlDeviceGetCount()
        except Exception as e:  # NVMLError: no driver, no device
            self.reason = f"NVML is not available: {e}"
            return
        if count == 0:
            self.reason = "no GPU found by NVML"
            return
        for i in range(count):
            handle = self._nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = self._nvml.nvmlDeviceGetUUID(handle)
            self.gpus.append(_Gpu(handle, uuid.decode() if isinstance(uuid, bytes) else str(uuid)))

    @property
    def available(self) -> bool:
        return bool(self.gpus)

    def poll(self) -> None:
        nvml: Any = self._nvml
        for gpu in self.gpus:
            for name, read in (
                ("utilization", lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
                ("memory", lambda h: nvml.nvmlDeviceGetMemoryInfo(h)),
                ("power_usage", lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                ("power_limit", lambda h: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
                ("energy", lambda h: nvml.nvmlDeviceGetTotalEnergyConsumption(h)),
            ):
                try:
                    value = read(gpu.handle)
                except Exception as e:  # a field this GPU does not support
                    if name not in gpu.errors:
                        gpu.errors.add(name)
                        log.warning("GPU %s: %s metric unavailable: %s", gpu.uuid, name, e)
                    continue
                if name == "memory":
                    gpu.memory_total, gpu.memory_used = int(value.total), int(value.used)
                elif name == "energy":
                    if gpu.energy_start_mj is None:
                        gpu.energy_start_mj = int(value)
                    gpu.energy_j = (int(value) - gpu.energy_start_mj) / 1000.0
                else:
                    setattr(gpu, name, float(value))

    def collect(self) -> Iterator[Any]:
        if not self.gpus:
            return
        labels = ["gpu_uuid"]
        util = GaugeMetricFamily("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", labels=labels)
        mem_total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", labels=labels)
        mem_used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", labels=labels)
        power = GaugeMetricFamily("nv_gpu_power_usage", "GPU power usage in watts", labels=labels)
        limit = GaugeMetricFamily("nv_gpu_power_limit", "GPU power management limit in watts", labels=labels)
        energy = CounterMetricFamily("nv_energy_consumption",
                                     "GPU energy consumption in joules since the Triton Server started",
                                     labels=labels)
        for g in self.gpus:
            util.add_metric([g.uuid], g.utilization)
            mem_total.add_metric([g.uuid], g.memory_total)
            mem_used.add_metric([g.uuid], g.memory_used)
            power.add_metric([g.uuid], g.power_usage)
            limit.add_metric([g.uuid], g.power_limit)
            energy.add_metric([g.uuid], g.energy_j)
        yield from (util, mem_total, mem_used, power, limit, energy)
