"""A stand-in for ``NvmlBackend`` with H100-like GPUs, for tests, demos and machines without GPUs.

Scenarios (``FakeNvmlBackend(scenario=...)`` or ``fake_backend_from_spec("hot:8")``):

- ``healthy``: busy GPUs (~0.9 utilization, ~70 GiB used, 55-70 °C, ~550 W, energy rising).
- ``idle``: memory held but utilization 0 and the gpu_idle clock reason active.
- ``old-driver``: no memory info v2 (no reserved bytes) and no remapped-row counters.
- ``gpu-lost``: GPU ``lost_gpu`` (3) goes down after ``lost_after_reads`` reads of it (0: from the start).
- ``not-supported``: ECC, power limit and clock-event reasons are not reported.
- ``library-missing``: init fails the way a host without the NVIDIA library does.
- ``hang``: reading GPU 0 blocks for ``hang_seconds`` (or until ``release()``).
- ``hot``: GPU ``faulty_gpu`` (0) at 92 °C with hw_thermal_slowdown and sw_power_cap, one XID 79,
  one uncorrectable ECC error and a remapped-row failure.

Values drift slowly with ``clock`` so dashboards move; the same clock gives the same values.
"""

from __future__ import annotations

import math
import threading
import time
import uuid as uuidlib
from typing import Any, Callable

from verl_exporter.gpu.backend import GpuReading, GpuUnavailable
from verl_exporter.gpu.nvml import CLOCK_EVENT_REASONS

SCENARIOS = ("healthy", "idle", "old-driver", "gpu-lost", "not-supported", "library-missing", "hang", "hot")
GIB = 1 << 30
H100_MEMORY_BYTES = 81559 * (1 << 20)  # what an H100 80GB HBM3 reports as total
FAKE_PID_BASE = 3_900_000  # synthetic pids, well above the usual pid range


def _reasons(*active: str) -> dict[str, bool]:
    return {name: name in active for name in CLOCK_EVENT_REASONS}


class FakeNvmlBackend:
    """Same interface as ``NvmlBackend``; see the module docstring for the scenarios."""

    def __init__(
        self,
        scenario: str = "healthy",
        gpus: int = 8,
        processes: dict[int, list[tuple[int, int]]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        lost_gpu: int = 3,
        lost_after_reads: int = 0,
        faulty_gpu: int = 0,
        hang_seconds: float = 3600.0,
        pcie_throughput: bool = False,
    ):
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown fake GPU scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
        self.scenario = scenario
        self.gpus = gpus
        self._processes = processes
        self._clock = clock
        self._start = clock()
        self.lost_gpu = lost_gpu
        self.lost_after_reads = lost_after_reads
        self.faulty_gpu = faulty_gpu
        self.hang_seconds = hang_seconds
        self.pcie_throughput = pcie_throughput
        self.error: str | None = None
        self.init_attempts = 0
        self.reads = 0
        self._reads_per_gpu: dict[int, int] = {}
        self._seen_uuid: set[int] = set()
        self._released = threading.Event()

    # -- lifecycle, as NvmlBackend ------------------------------------------------------------

    @property
    def available(self) -> bool:
        return self.scenario != "library-missing"

    def ensure_initialized(self) -> bool:
        self.init_attempts += 1
        if self.scenario == "library-missing":
            self.error = "NVML library (libnvidia-ml.so.1) not found (fake GPUs: library-missing); GPU metrics are off"
            return False
        return True

    def start(self) -> None:
        self.ensure_initialized()

    def stop(self) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        self.release()

    def release(self) -> None:
        """Unblock a read stuck in the ``hang`` scenario."""
        self._released.set()

    def start_xid_watcher(self) -> bool:
        return self.available

    def stop_xid_watcher(self) -> None:
        pass

    # -- system -------------------------------------------------------------------------------

    def device_count(self) -> int:
        if not self.available:
            raise GpuUnavailable(self.error or "NVML is not initialised")
        return self.gpus

    def driver_version(self) -> str | None:
        return "535.54.03" if self.scenario == "old-driver" else "550.54.15"

    def cuda_driver_version(self) -> str | None:
        return "12.2" if self.scenario == "old-driver" else "12.4"

    def xid_counts(self) -> dict[tuple[int, int], int]:
        return {(self.faulty_gpu, 79): 1} if self.scenario == "hot" and self.gpus > self.faulty_gpu else {}

    # -- per device ---------------------------------------------------------------------------

    @staticmethod
    def uuid_of(index: int) -> str:
        return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"verl-exporter/fake-gpu/{index}"))

    def _is_lost(self, index: int) -> bool:
        if self.scenario != "gpu-lost" or index != self.lost_gpu:
            return False
        return self._reads_per_gpu.get(index, 0) > self.lost_after_reads

    def read_device(self, index: int) -> GpuReading:
        self.reads += 1
        self._reads_per_gpu[index] = self._reads_per_gpu.get(index, 0) + 1
        if self.scenario == "hang" and index == 0:
            self._released.wait(self.hang_seconds)
        if self._is_lost(index):
            uuid = self.uuid_of(index) if index in self._seen_uuid else ""
            return GpuReading(index=index, uuid=uuid, up=False)
        self._seen_uuid.add(index)
        return self._healthy_reading(index)

    def _healthy_reading(self, index: int) -> GpuReading:
        t = self._clock() - self._start
        wave = math.sin(t / 5.0 + index * 0.7)
        slow = math.sin(t / 30.0 + index * 1.3)
        idle = self.scenario == "idle"
        used = int(70 * GIB + 0.5 * GIB * wave)
        reserved = 512 * (1 << 20)
        power = 120.0 + 3 * wave if idle else 550.0 + 20 * wave
        reading = GpuReading(
            index=index,
            uuid=self.uuid_of(index),
            name="NVIDIA H100 80GB HBM3",
            pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            memory_total_bytes=H100_MEMORY_BYTES,
            memory_used_bytes=used,
            memory_free_bytes=H100_MEMORY_BYTES - used - reserved,
            memory_reserved_bytes=reserved,
            utilization_ratio=0.0 if idle else round(0.9 + 0.05 * wave, 2),
            memory_utilization_ratio=0.0 if idle else round(0.45 + 0.05 * wave, 2),
            temperature_celsius=float(round(38 + 2 * slow) if idle else round(62 + 7 * slow)),
            power_watts=power,
            power_limit_watts=700.0,
            energy_joules=1.0e6 + (120.0 if idle else 550.0) * t + index,
            sm_clock_hertz=1980e6,
            memory_clock_hertz=2619e6,
            clock_event_reasons=_reasons("gpu_idle") if idle else _reasons(),
            ecc_errors={"corrected": 0, "uncorrected": 0},
            ecc_volatile_errors={"corrected": 0, "uncorrected": 0},
            remapped_rows={"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0},
            pcie_replay_errors=0,
        )
        if self.pcie_throughput:
            reading.pcie_throughput_bytes_per_second = {"tx": 2.0e9 + 1e8 * wave, "rx": 1.5e9 - 1e8 * wave}
        if self.scenario == "old-driver":
            reading.memory_reserved_bytes = None
            reading.memory_used_bytes = used + reserved  # v1 counts reserved memory as used
            reading.remapped_rows = None
        elif self.scenario == "not-supported":
            reading.ecc_errors = reading.ecc_volatile_errors = None
            reading.power_limit_watts = None
            reading.clock_event_reasons = None
        elif self.scenario == "hot" and index == self.faulty_gpu:
            reading.temperature_celsius = 92.0
            reading.power_watts = 690.0
            reading.sm_clock_hertz = 1410e6
            reading.clock_event_reasons = _reasons("sw_power_cap", "hw_thermal_slowdown")
            reading.ecc_errors = {"corrected": 12, "uncorrected": 1}
            reading.ecc_volatile_errors = {"corrected": 3, "uncorrected": 1}
            reading.remapped_rows = {"correctable": 0, "uncorrectable": 1, "pending": 0, "failure": 1}
        return reading

    def running_processes(self, index: int) -> list[tuple[int, int | None]]:
        if self.scenario == "library-missing" or self._is_lost(index):
            return []
        if self._processes is not None:
            return list(self._processes.get(index, []))
        return [(FAKE_PID_BASE + index, 69 * GIB)]


def fake_backend_from_spec(spec: str, **kwargs: Any) -> FakeNvmlBackend:
    """``"healthy:8"`` → 8 healthy fake GPUs; the count is optional (``"hot"`` means 8)."""
    scenario, _, count = spec.partition(":")
    try:
        gpus = int(count) if count else 8
    except ValueError:
        raise ValueError(f"bad fake GPU spec {spec!r}: expected SCENARIO[:COUNT], e.g. healthy:8") from None
    if gpus < 0:
        raise ValueError(f"bad fake GPU spec {spec!r}: the GPU count cannot be negative")
    return FakeNvmlBackend(scenario.strip() or "healthy", gpus=gpus, **kwargs)
