"""An NVML stand-in with pynvml's function names, for machines without an NVIDIA GPU.

Why a stand-in: NVML needs the NVIDIA driver and a GPU, which CI machines do not have. Every test
that uses it for a decision has a twin marked `gpu` that runs the same assertions against the
real pynvml on the GPU box (tests/guards/test_gpu_guard.py). It mimics only what sparkd calls,
with pynvml's error class, codes and result shapes (usedGpuMemory None = "not available").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_UNKNOWN = 999
_MESSAGES = {3: "Not Supported", 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found", 999: "Unknown Error"}


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeGpu:
    name: str = "NVIDIA GB10"
    total_bytes: int | None = None  # None: memory info NOT_SUPPORTED (unified memory)
    used_bytes: int = 0
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes or None)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    process_error: int | None = None  # make the process queries fail with this code


class FakeNvml:
    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: int | None = None):
        self.gpus = gpus or []
        self.init_error = init_error
        self.initialized = 0  # nvmlInit minus nvmlShutdown calls: must be back at 0 after a read

    def nvmlInit(self):
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self):
        self.initialized -= 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu):
        return gpu.name

    def nvmlDeviceGetMemoryInfo(self, gpu):
        if gpu.total_bytes is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(total=gpu.total_bytes, used=gpu.used_bytes, free=gpu.total_bytes - gpu.used_bytes)

    def _procs(self, gpu, entries):
        if gpu.process_error is not None:
            raise NVMLError(gpu.process_error)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in entries]

    def nvmlDeviceGetComputeRunningProcesses(self, gpu):
        return self._procs(gpu, gpu.compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, gpu):
        return self._procs(gpu, gpu.graphics)
