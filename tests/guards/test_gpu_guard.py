"""The GPU guard sees a process holding GPU memory and refuses, naming pid, name, unit and MiB.

Each test runs twice: with "standin", a real process (a renamed sleep) that an NVML stand-in
reports as holding 2 GiB, because CI machines have no GPU (tests/fake_nvml.py); and with "cuda"
(marked gpu, the GPU box) where a real torch process holds 2 GiB on CUDA and the real pynvml is read.
"""

import subprocess
import sys

import psutil
import pytest

from fake_nvml import FakeGpu, FakeNvml
from procs import reap, spawn_named, unique_name
from sparkd.errors import GuardRefusal
from sparkd.guards import GuardContext, preflight
from sparkd.guards.gpu import judge_gpu
from sparkd.policy import parse_policy
from sparkd.system.gpu import GpuProcess, GpuSnapshot
from sparkd.system.procinfo import cgroup_unit

GiB = 1 << 30
HOLD_CUDA = ("import sys, time, torch\n"
             "x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()\n"
             "print('ready', flush=True); sys.stdin.read()\n")  # holds until the test closes stdin


@pytest.fixture(scope="module", params=["standin", pytest.param("cuda", marks=pytest.mark.gpu)])
def holder(request, tmp_path_factory):
    """(pid, name, nvml) of a process holding 2 GiB of GPU memory; nvml None means the real pynvml."""
    if request.param == "standin":
        proc = spawn_named(tmp_path_factory.mktemp("gpu"), unique_name("gpu-holder"))
        nvml = FakeNvml([FakeGpu("NVIDIA H200", 141 * GiB, 3 * GiB, compute=[(proc.pid, 2 * GiB + 500 * (1 << 20))])])
    else:
        proc = subprocess.Popen([sys.executable, "-c", HOLD_CUDA], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready", "the CUDA holder did not start"
        nvml = None
    yield proc.pid, psutil.Process(proc.pid).name(), nvml
    if request.param == "standin":
        reap(proc)
    else:
        proc.stdin.close()  # the holder exits and frees its GPU memory
        proc.wait(timeout=60)


def make_policy(**guards):
    return parse_policy({"services": {"svc": {"engine": {"command": ["sleep", "1"]}, "memory_max": "1G"}},
                         "guards": {"competitors": [], "reserve": "1G", **guards}},
                        source="test", total_memory_bytes=64 * GiB)


def context(tmp_path, nvml, **kw):
    meminfo = tmp_path / "meminfo"  # plenty of room: only the GPU guard may refuse here
    meminfo.write_text("MemTotal: 67108864 kB\nMemAvailable: 60000000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")
    return GuardContext(meminfo_path=meminfo, nvml=nvml, **kw)


async def test_refuses_naming_pid_name_unit_and_mib(holder, tmp_path):
    pid, name, nvml = holder
    report = await preflight(make_policy(gpu_busy_mib=1024), "svc", context(tmp_path, nvml))
    print("\n" + report.render())
    gpu = next(c for c in report.checks if c.name == "gpu")
    assert gpu.status == "refused" and gpu.policy_key == "guards.gpu_busy_mib"
    mine = [c for c in gpu.culprits if c.pid == pid]
    assert len(mine) == 1 and mine[0].name == name and mine[0].mib >= 2048
    assert mine[0].unit == cgroup_unit(pid)
    with pytest.raises(GuardRefusal) as err:
        report.raise_if_refused()
    assert f"pid {pid} {name}" in str(err.value) and f"{mine[0].mib} MiB" in str(err.value)
    assert "guards.gpu_busy_mib" in str(err.value)
    assert {"pid": pid, "name": name, "mib": mine[0].mib, "policy_key": "guards.gpu_busy_mib"}.items() <= \
        next(c for c in err.value.culprits if c["pid"] == pid).items()


async def test_threshold_above_the_holder_passes(holder, tmp_path):
    pid, name, nvml = holder
    report = await preflight(make_policy(gpu_busy_mib=64 * 1024), "svc", context(tmp_path, nvml))
    gpu = next(c for c in report.checks if c.name == "gpu")
    assert gpu.status == "ok", gpu.message
    assert any(c.pid == pid for c in gpu.culprits)  # still listed, below the limit


async def test_ignored_name_does_not_count(holder, tmp_path):
    pid, name, nvml = holder
    report = await preflight(make_policy(gpu_busy_mib=1024, gpu_ignore=[name]), "svc", context(tmp_path, nvml))
    gpu = next(c for c in report.checks if c.name == "gpu")
    assert gpu.status == "ok" and f"ignored {name} (pid {pid}" in gpu.message
    assert not any(c.pid == pid for c in gpu.culprits)


async def test_units_come_from_the_lookup_and_own_unit_is_freed_by_restart(holder, tmp_path):
    pid, name, nvml = holder

    async def unit_of(p):
        return "sparkd-svc.service" if p == pid else None

    report = await preflight(make_policy(gpu_busy_mib=1024), "svc", context(tmp_path, nvml, unit_of=unit_of))
    gpu = next(c for c in report.checks if c.name == "gpu")
    assert f"pid {pid}) belongs to sparkd-svc.service" in gpu.message
    assert not any(c.pid == pid for c in gpu.culprits)

    async def ollama(p):
        return "ollama.service"

    report = await preflight(make_policy(gpu_busy_mib=1024), "svc", context(tmp_path, nvml, unit_of=ollama))
    gpu = next(c for c in report.checks if c.name == "gpu")
    assert gpu.status == "refused" and next(c for c in gpu.culprits if c.pid == pid).unit == "ollama.service"
    assert f"pid {pid} {name} unit ollama.service" in report.render()

    async def broken(p):
        raise ConnectionError("bus gone")

    report = await preflight(make_policy(gpu_busy_mib=1024), "svc",
                             context(tmp_path, nvml, unit_of=broken))
    gpu = next(c for c in report.checks if c.name == "gpu")
    assert next(c for c in gpu.culprits if c.pid == pid).unit == cgroup_unit(pid)  # fell back to /proc


def test_no_driver_is_shown_as_skipped():
    policy = make_policy()
    check = judge_gpu(GpuSnapshot(False, "no NVIDIA driver (NVML Shared Library Not Found)"), policy.guards, {})
    assert (check.status, check.message) == ("skipped", "GPU guard skipped: no NVIDIA driver (NVML Shared Library Not Found)")


def test_unmeasurable_process_is_a_warning_not_silence():
    snap = GpuSnapshot(True, "", (), (GpuProcess(0, 4242, None, None, "unknown", ("compute",)),))
    check = judge_gpu(snap, make_policy().guards, {})
    assert check.status == "warning" and "cannot measure GPU memory of pid 4242 (?)" in check.message
