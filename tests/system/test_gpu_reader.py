"""GpuReader against the NVML stand-in (fake_nvml.py says why) and against the real pynvml."""

import os

from fake_nvml import NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_UNKNOWN, FakeGpu, FakeNvml
from procs import reap, spawn_named, unique_name
from sparkd.system.gpu import GpuReader

MiB = 1 << 20
MEMINFO = "MemTotal: 1048576 kB\nMemAvailable: 262144 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"


def test_real_pynvml_reports_gpus_or_why_not():
    snap = GpuReader().read()
    if snap.available:  # the GPU box
        assert snap.devices and all(d.memory_source in ("nvml", "meminfo") for d in snap.devices)
    else:  # CI: the library or the driver is missing, and the reason says so
        assert snap.reason.startswith("no NVIDIA driver ("), snap.reason


def test_no_driver_is_a_result_with_the_reason():
    for code, text in ((NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
                       (NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded")):
        snap = GpuReader(FakeNvml(init_error=code)).read()
        assert (snap.available, snap.reason) == (False, f"no NVIDIA driver ({text})")
    snap = GpuReader(FakeNvml(init_error=NVML_ERROR_UNKNOWN)).read()
    assert snap.reason == "could not start NVML: Unknown Error"


def test_discrete_gpu_memory_and_processes_merged():
    nvml = FakeNvml([FakeGpu("NVIDIA H200", 141 << 30, 3 << 30, compute=[(os.getpid(), 2048 * MiB)],
                             graphics=[(os.getpid(), 100 * MiB)])])
    snap = GpuReader(nvml).read()
    assert nvml.initialized == 0  # shut down again
    (dev,) = snap.devices
    assert (dev.name, dev.total_bytes, dev.used_bytes, dev.memory_source) == ("NVIDIA H200", 141 << 30, 3 << 30, "nvml")
    (proc,) = snap.processes  # one entry although NVML listed the pid twice
    assert (proc.pid, proc.used_mib, proc.mib_source, proc.kinds) == (os.getpid(), 2048, "nvml", ("compute", "graphics"))
    assert proc.name == open(f"/proc/{os.getpid()}/comm").read().strip()


def test_unified_memory_falls_back_to_meminfo_and_rss(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    name = unique_name("gb10-engine")
    holder = spawn_named(tmp_path, name)
    try:
        nvml = FakeNvml([FakeGpu("NVIDIA GB10", None, compute=[(holder.pid, None)])])  # GB10: NOT_SUPPORTED
        snap = GpuReader(nvml, meminfo_path=meminfo).read()
    finally:
        reap(holder)
    (dev,) = snap.devices
    assert (dev.total_bytes, dev.used_bytes, dev.memory_source) == (1 << 30, 768 << 20, "meminfo")
    (proc,) = snap.processes
    assert (proc.pid, proc.name, proc.mib_source) == (holder.pid, name, "rss")
    assert proc.used_mib is not None and proc.used_mib >= 0


def test_failing_process_query_is_recorded_and_nvml_shut_down():
    nvml = FakeNvml([FakeGpu("NVIDIA H200", 141 << 30, process_error=NVML_ERROR_UNKNOWN)])
    snap = GpuReader(nvml).read()
    assert nvml.initialized == 0
    assert snap.available and snap.processes == ()
    assert snap.devices[0].errors == ("could not list compute processes: Unknown Error",
                                      "could not list graphics processes: Unknown Error")


def test_invisible_pid_has_no_name_and_unknown_memory():
    pid = 2**22 + 7  # above pid_max: never a live process here
    snap = GpuReader(FakeNvml([FakeGpu("NVIDIA GB10", None, compute=[(pid, None)])])).read()
    (proc,) = snap.processes
    assert (proc.name, proc.used_mib, proc.mib_source) == (None, None, "unknown")


def test_unified_memory_with_unreadable_meminfo_is_recorded(tmp_path):
    snap = GpuReader(FakeNvml([FakeGpu("NVIDIA GB10", None)]), meminfo_path=tmp_path / "nope").read()
    (dev,) = snap.devices
    assert (dev.total_bytes, dev.memory_source) == (None, "unknown")
    assert dev.errors == (f"NVML memory info not supported and could not read {tmp_path / 'nope'}: No such file or directory",)
