"""GPUs and the processes holding GPU memory, through NVML (nvidia-ml-py, module pynvml).

The NVML binding is a constructor parameter: production uses pynvml; tests on machines without a
GPU hand in an object with the same function names (and the same tests run against the real
pynvml on the GPU box). NVML failing to start (no driver, no library) is a normal result
("unavailable" with the reason), not an error: most of sparkd's CI machines have no GPU.

On GB10 (DGX Spark, unified memory) nvmlDeviceGetMemoryInfo answers NOT_SUPPORTED: the device's
memory is the system's, so its figures come from /proc/meminfo; a process whose used GPU memory
NVML cannot report is measured by its resident set instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SparkdError
from .meminfo import DEFAULT_MEMINFO_PATH, read_meminfo
from .procinfo import DEFAULT_PROC_ROOT, process_name, rss_bytes

MIB = 1 << 20
# pynvml's error codes (nvml.h); a stand-in binding must define the same attribute names.
_NO_DRIVER_CODES = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")


@dataclass(frozen=True)
class GpuProcess:
    gpu_index: int
    pid: int
    name: str | None  # None: the pid is not visible in this /proc (another pid namespace)
    used_mib: int | None
    mib_source: str  # "nvml" | "rss" (NVML could not say) | "unknown"
    kinds: tuple[str, ...]  # "compute", "graphics"


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    total_bytes: int | None
    used_bytes: int | None
    memory_source: str  # "nvml" | "meminfo" (unified memory) | "unknown"
    errors: tuple[str, ...] = ()  # queries that failed; the process list may be incomplete


@dataclass(frozen=True)
class GpuSnapshot:
    available: bool
    reason: str = ""  # why NVML is unavailable, e.g. "no NVIDIA driver (NVML Shared Library Not Found)"
    devices: tuple[GpuDevice, ...] = ()
    processes: tuple[GpuProcess, ...] = field(default=())

    def to_dict(self) -> dict:
        return asdict(self)


def _load_pynvml() -> Any:
    import pynvml  # imported late: sparkd runs without the package on machines with no GPU

    return pynvml


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuReader:
    """Reads one GpuSnapshot per call to read(); NVML is started and shut down each time so a
    driver loaded or unloaded while sparkd runs is noticed."""

    def __init__(self, nvml: Any = None, *, proc_root: Path = DEFAULT_PROC_ROOT,
                 meminfo_path: Path = DEFAULT_MEMINFO_PATH):
        self._nvml = nvml
        self._proc_root = Path(proc_root)
        self._meminfo_path = Path(meminfo_path)

    def read(self) -> GpuSnapshot:
        try:
            nvml = self._nvml if self._nvml is not None else _load_pynvml()
        except ImportError as exc:
            return GpuSnapshot(False, f"nvidia-ml-py is not installed ({exc}); pip install nvidia-ml-py")
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            return GpuSnapshot(False, self._init_failure(nvml, exc))
        try:
            return self._read_devices(nvml)
        finally:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass  # nothing to release if shutdown itself fails

    @staticmethod
    def _init_failure(nvml: Any, exc: Exception) -> str:
        code = getattr(exc, "value", None)
        if code in {getattr(nvml, name, object()) for name in _NO_DRIVER_CODES}:
            return f"no NVIDIA driver ({exc})"
        return f"could not start NVML: {exc}"

    def _read_devices(self, nvml: Any) -> GpuSnapshot:
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            return GpuSnapshot(False, f"could not count GPUs through NVML: {exc}")
        devices, processes = [], []
        for index in range(count):
            device, procs = self._read_device(nvml, index)
            devices.append(device)
            processes.extend(procs)
        return GpuSnapshot(True, "", tuple(devices), tuple(processes))

    def _read_device(self, nvml: Any, index: int) -> tuple[GpuDevice, list[GpuProcess]]:
        errors: list[str] = []
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(nvml.nvmlDeviceGetName(handle))
        except nvml.NVMLError as exc:
            return GpuDevice(index, "?", None, None, "unknown", (f"could not open GPU {index}: {exc}",)), []
        total, used, source = self._memory(nvml, handle, errors)
        procs = self._processes(nvml, handle, index, errors)
        return GpuDevice(index, name, total, used, source, tuple(errors)), procs

    def _memory(self, nvml: Any, handle: Any, errors: list[str]) -> tuple[int | None, int | None, str]:
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.total), int(info.used), "nvml"
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) != nvml.NVML_ERROR_NOT_SUPPORTED:
                errors.append(f"could not read GPU memory info: {exc}")
                return None, None, "unknown"
        # Unified memory (GB10): the GPU allocates from system memory.
        try:
            mem = read_meminfo(self._meminfo_path)
        except SparkdError as exc:
            errors.append(f"NVML memory info not supported and {exc}")
            return None, None, "unknown"
        return mem.total_bytes, mem.total_bytes - mem.available_bytes, "meminfo"

    def _processes(self, nvml: Any, handle: Any, index: int, errors: list[str]) -> list[GpuProcess]:
        used_by_pid: dict[int, int | None] = {}
        kinds_by_pid: dict[int, list[str]] = {}
        queries = (("compute", nvml.nvmlDeviceGetComputeRunningProcesses),
                   ("graphics", nvml.nvmlDeviceGetGraphicsRunningProcesses))
        for kind, query in queries:
            try:
                infos = query(handle)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != nvml.NVML_ERROR_NOT_SUPPORTED:
                    errors.append(f"could not list {kind} processes: {exc}")
                continue
            for info in infos:
                pid, used = int(info.pid), info.usedGpuMemory  # None: NVML cannot say
                kinds_by_pid.setdefault(pid, []).append(kind)
                known = used_by_pid.get(pid)
                used_by_pid[pid] = used if known is None else max(known, used or 0)
        return [self._process(index, pid, used, tuple(kinds_by_pid[pid])) for pid, used in used_by_pid.items()]

    def _process(self, index: int, pid: int, used_bytes: int | None, kinds: tuple[str, ...]) -> GpuProcess:
        name = process_name(pid, self._proc_root)
        if used_bytes is not None:
            return GpuProcess(index, pid, name, int(used_bytes) // MIB, "nvml", kinds)
        rss = rss_bytes(pid, self._proc_root)
        if rss is not None:
            return GpuProcess(index, pid, name, rss // MIB, "rss", kinds)
        return GpuProcess(index, pid, name, None, "unknown", kinds)
