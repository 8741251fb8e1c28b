"""A stand-in for AMD's ``amdsmi`` Python module, shaped like the real binding.

Function names, arguments, enums, status codes, exception classes and the keys and value types of
what the functions return follow amdsmi's own py-interface (``amdsmi_interface.py``,
``amdsmi_exception.py``, ``amdsmi_wrapper.py`` in ROCm/rocm-systems ``projects/amdsmi`` and the
older ROCm/amdsmi): dicts with "N/A" for what a GPU does not report, AmdSmiLibraryException with
``err_code`` and a multi-line ``str()``, enum arguments checked with AmdSmiParameterException.

``FakeAmdSmi(gpus, model=..., release=...)``; switches:

- ``model``: ``"MI300X"`` (no edge sensor, power in ``current_socket_power``, 192 GB) or ``"MI250X"``
  (edge sensor, power in ``average_socket_power``, 64 GB).
- ``release``: ``"current"`` (the names of recent releases) or ``"legacy"`` (the first releases:
  ``amdsmi_get_power_measure``, ``amdsmi_get_clock_measure`` with ``cur_clk``, ``power`` as the
  energy key, process handles for ``amdsmi_get_gpu_process_info``, ``amdsmi_get_gpu_driver_version``).
- ``init_status``: a status code ``amdsmi_init`` fails with (e.g. ``DRIVER_NOT_LOADED``).
- ``lost``: GPU indices whose calls fail with ``lost_status`` (NOT_FOUND), as a GPU off the bus.
- ``silent``: GPU indices whose calls all fail with NOT_SUPPORTED (a GPU whose sysfs is gone).
- ``unsupported``: function names that fail with NOT_SUPPORTED on every GPU.
- ``failing``: {function name: status} that fail with that status (e.g. RETRY, TIMEOUT).
- ``na``: {function name: keys} whose values come back as "N/A".
- ``replace``: {function name: value} returned instead of the model's.
- ``calls``: a Counter of the calls made.

``install_broken_amdsmi(path)`` writes an ``amdsmi`` package that fails to import the way the real
one does without ROCm's libamd_smi.so (it prints, then raises KeyError).
"""

from __future__ import annotations

import textwrap
from collections import Counter
from enum import IntEnum
from pathlib import Path
from types import SimpleNamespace

STATUS = {
    "SUCCESS": 0, "INVAL": 1, "NOT_SUPPORTED": 2, "NOT_YET_IMPLEMENTED": 3, "DRM_ERROR": 6, "API_FAILED": 7,
    "TIMEOUT": 8, "RETRY": 9, "NO_PERM": 10, "IO": 12, "INIT_ERROR": 18, "NOT_FOUND": 31, "NOT_INIT": 32,
    "DRIVER_NOT_LOADED": 34, "NO_DATA": 40, "AMDGPU_RESTART_ERR": 54,
}
MB = 1 << 20
ENERGY_RESOLUTION_UJ = 15.259000301361084  # a float32, as the binding returns it
MODELS = {
    "MI300X": dict(market_name="AMD Instinct MI300X", vram_mb=196592, used_mb=153600, edge=None, hotspot=96,
                   power_key="current_socket_power", watts=650, cap_uw=750_000_000, gfx_mhz=2100, mem_mhz=1300),
    "MI250X": dict(market_name="AMD Instinct MI250X/MI250", vram_mb=65520, used_mb=50000, edge=52, hotspot=97,
                   power_key="average_socket_power", watts=480, cap_uw=560_000_000, gfx_mhz=1700, mem_mhz=1600),
}


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code):
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        name = next((n for n, c in STATUS.items() if c == err_code), "UNKNOWN_ERROR")
        self.err_info = f"AMDSMI_STATUS_{name} - {name.replace('_', ' ').capitalize()}"

    def __str__(self):
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_code(self):
        return self.err_code


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self):
        super().__init__(STATUS["RETRY"])


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self):
        super().__init__(STATUS["TIMEOUT"])


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received, expected):
        super().__init__(f"Invalid parameter:\nActual type: {type(received)}\nExpected type: {expected}")


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1
    MIN = 2


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4


class ProcessorHandle:
    """Stands for amdsmi_wrapper.amdsmi_processor_handle (a ctypes pointer)."""

    def __init__(self, index):
        self.index = index


class ProcessHandle(int):
    """Stands for the legacy amdsmi_process_handle (a c_uint32)."""


class FakeAmdSmi:
    """The ``amdsmi`` module for AmdSmiBackend; see the module docstring for the switches."""

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiRetryException = AmdSmiRetryException
    AmdSmiTimeoutException = AmdSmiTimeoutException
    AmdSmiParameterException = AmdSmiParameterException
    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiMemoryType = AmdSmiMemoryType
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiClkType = AmdSmiClkType

    def __init__(self, gpus=8, *, model="MI300X", release="current", processes=None):
        self.amdsmi_wrapper = SimpleNamespace(**{f"AMDSMI_STATUS_{name}": code for name, code in STATUS.items()})
        self.gpus = gpus
        self.spec = MODELS[model]
        self.release = release
        self.processes = {0: [(4242, 60 * 1024 * MB)]} if processes is None else processes
        self.init_status: str | None = None
        self.lost: set[int] = set()
        self.lost_status = "NOT_FOUND"
        self.silent: set[int] = set()
        self.unsupported: set[str] = set()
        self.failing: dict[str, str] = {}
        self.na: dict[str, set[str]] = {}
        self.replace: dict[str, object] = {}
        self.calls: Counter = Counter()
        self.energy_ticks = 0
        self.initialized = False

    def __getattr__(self, name):
        """The amdsmi functions: each call is counted and checked against the switches."""
        current = {"amdsmi_get_power_info", "amdsmi_get_clock_info", "amdsmi_get_gpu_total_ecc_count",
                   "amdsmi_get_gpu_driver_info"}
        legacy = {"amdsmi_get_power_measure", "amdsmi_get_clock_measure", "amdsmi_get_gpu_ecc_error_count",
                  "amdsmi_get_gpu_driver_version", "amdsmi_get_gpu_process_info"}
        if not name.startswith("amdsmi_") or name in (legacy if self.release == "current" else current):
            raise AttributeError(name)
        body = getattr(type(self), "_" + name)

        def call(*args):
            self.calls[name] += 1
            handle = args[0] if args and isinstance(args[0], ProcessorHandle) else None
            if name not in ("amdsmi_init", "amdsmi_shut_down") and not self.initialized:
                raise AmdSmiLibraryException(STATUS["NOT_INIT"])
            if handle is not None:
                self._check(name, handle.index)
            return self.replace[name] if name in self.replace else self._na(name, body(self, *args))

        return call

    def _check(self, name, gpu):
        if gpu in self.lost:
            raise AmdSmiLibraryException(STATUS[self.lost_status])
        if gpu in self.silent or name in self.unsupported:
            raise AmdSmiLibraryException(STATUS["NOT_SUPPORTED"])
        if name in self.failing:
            status = self.failing[name]
            raise AmdSmiRetryException() if status == "RETRY" else AmdSmiLibraryException(STATUS[status])

    def _na(self, name, result):
        for key in self.na.get(name, ()):
            result[key] = "N/A"
        return result

    # -- the functions, as amdsmi_interface.py shapes their results ------------------------------

    def _amdsmi_init(self, flag=AmdSmiInitFlags.INIT_AMD_GPUS):
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        if self.init_status is not None:
            raise AmdSmiLibraryException(STATUS[self.init_status])
        self.initialized = True

    def _amdsmi_shut_down(self):
        self.initialized = False

    def _amdsmi_get_processor_handles(self):
        return [ProcessorHandle(index) for index in range(self.gpus)]

    def _amdsmi_get_gpu_device_uuid(self, h):
        return f"{h.index:02x}ff74a1-0000-1000-80a3-4c2d6dbd7a5c"

    def _amdsmi_get_gpu_asic_info(self, h):
        return {"market_name": self.spec["market_name"], "vendor_id": "0x1002",
                "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]", "device_id": "0x74a1", "rev_id": "0x00",
                "asic_serial": "0x1234567890ABCDEF", "oam_id": h.index,
                "num_compute_units": 304, "target_graphics_version": "gfx942"}

    def _amdsmi_get_gpu_board_info(self, h):
        return {"model_number": "102-G30211-00", "product_serial": "692331000000", "fru_id": "N/A",
                "product_name": "AMD Instinct MI300X OAM", "manufacturer_name": "AMD"}

    def _amdsmi_get_gpu_device_bdf(self, h):
        return f"0000:{0x05 + 0x20 * h.index:02x}:00.0"

    def _amdsmi_get_gpu_memory_total(self, h, mem_type):
        if not isinstance(mem_type, AmdSmiMemoryType):
            raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
        return self.spec["vram_mb"] * MB

    def _amdsmi_get_gpu_memory_usage(self, h, mem_type):
        if not isinstance(mem_type, AmdSmiMemoryType):
            raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
        return self.spec["used_mb"] * MB + h.index

    def _amdsmi_get_gpu_vram_usage(self, h):
        return {"vram_total": self.spec["vram_mb"], "vram_used": self.spec["used_mb"]}

    def _amdsmi_get_gpu_activity(self, h):
        return {"gfx_activity": 97, "umc_activity": 45, "mm_activity": "N/A"}

    def _amdsmi_get_temp_metric(self, h, sensor, metric):
        if not isinstance(sensor, AmdSmiTemperatureType):
            raise AmdSmiParameterException(sensor, AmdSmiTemperatureType)
        if not isinstance(metric, AmdSmiTemperatureMetric):
            raise AmdSmiParameterException(metric, AmdSmiTemperatureMetric)
        value = self.spec["hotspot"] if sensor == AmdSmiTemperatureType.HOTSPOT else self.spec["edge"]
        if sensor == AmdSmiTemperatureType.EDGE and value is None:
            raise AmdSmiLibraryException(STATUS["NOT_SUPPORTED"])  # MI300 has no edge sensor
        return value

    def _amdsmi_get_power_info(self, h):
        info = {"socket_power": "N/A", "current_socket_power": "N/A", "average_socket_power": "N/A",
                "gfx_voltage": "N/A", "soc_voltage": "N/A", "mem_voltage": "N/A",
                "power_limit": self.spec["cap_uw"] // 1_000_000, "ubb_power": "N/A"}
        info[self.spec["power_key"]] = self.spec["watts"]
        return info

    def _amdsmi_get_power_measure(self, h):  # legacy
        return {"average_socket_power": self.spec["watts"], "voltage_gfx": 800, "energy_accumulator": 0,
                "power_limit": 0}

    def _amdsmi_get_power_cap_info(self, h, sensor_ind=0):
        return {"power_cap": self.spec["cap_uw"], "default_power_cap": self.spec["cap_uw"], "dpm_cap": 0,
                "min_power_cap": 0, "max_power_cap": self.spec["cap_uw"]}

    def _amdsmi_get_energy_count(self, h):
        self.energy_ticks += 1000
        key = "energy_accumulator" if self.release == "current" else "power"
        return {key: 10**9 + self.energy_ticks + h.index, "counter_resolution": ENERGY_RESOLUTION_UJ,
                "timestamp": 1_700_000_000_000_000_000}

    def _clock(self, clock_type):
        if not isinstance(clock_type, AmdSmiClkType):
            raise AmdSmiParameterException(clock_type, AmdSmiClkType)
        return self.spec["mem_mhz"] if clock_type == AmdSmiClkType.MEM else self.spec["gfx_mhz"]

    def _amdsmi_get_clock_info(self, h, clock_type):
        return {"clk": self._clock(clock_type), "min_clk": 500, "max_clk": 2100, "clk_locked": False,
                "clk_deep_sleep": "N/A"}

    def _amdsmi_get_clock_measure(self, h, clock_type):  # legacy
        return {"cur_clk": self._clock(clock_type), "avg_clk": 0, "min_clk": 500, "max_clk": 2100}

    def _amdsmi_get_gpu_total_ecc_count(self, h):
        return {"correctable_count": 3, "uncorrectable_count": 0, "deferred_count": 0}

    def _amdsmi_get_gpu_ecc_error_count(self, h):  # legacy
        return {"correctable_count": 3, "uncorrectable_count": 0}

    def _amdsmi_get_gpu_pci_replay_counter(self, h):
        return 2

    def _process(self, pid, vram):
        return {"name": "python3", "pid": pid, "mem": vram + 4 * MB,
                "engine_usage": {"gfx": 123456, "enc": 0},
                "memory_usage": {"gtt_mem": 2 * MB, "cpu_mem": 2 * MB, "vram_mem": vram}}

    def _amdsmi_get_gpu_process_list(self, h):
        procs = self.processes.get(h.index, [])
        if self.release == "legacy":
            return [ProcessHandle(pid) for pid, _ in procs]
        return [self._process(pid, vram) for pid, vram in procs]

    def _amdsmi_get_gpu_process_info(self, h, process):  # legacy
        vram = dict(self.processes.get(h.index, []))[int(process)]
        return self._process(int(process), vram)

    def _amdsmi_get_gpu_driver_info(self, h):
        return {"driver_name": "amdgpu", "driver_version": "6.8.5", "driver_date": "2015/01/01 00:00"}

    def _amdsmi_get_gpu_driver_version(self, h):  # legacy
        return "6.2.4"


def install_broken_amdsmi(path: Path) -> Path:
    """An importable ``amdsmi`` package under ``path`` that fails like the real one without libamd_smi.so."""
    package = path / "amdsmi"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(textwrap.dedent("""\
        print("libamd_smi.so: cannot open shared object file: No such file or directory")
        print("Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager")
        _libraries = {}
        _libraries['libamd_smi.so'].amdsmi_free_name_value_pairs
    """))
    return path
