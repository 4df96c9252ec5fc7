"""PSI on this machine's real files: triggers register on a cgroup2 memory.pressure (hybrid host:
the file exists without the memory controller) and on /proc/pressure/memory; a refused trigger is
reported and falls back; the detector samples, and POLLERR / a vanished file ends it as "gone"."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from sparkd.watch.psi import PressureGone, PsiDetector, TriggerSpec, register_trigger

pytestmark = pytest.mark.root
CGROUP2 = Path("/sys/fs/cgroup") if Path("/sys/fs/cgroup/cgroup.controllers").exists() else Path("/sys/fs/cgroup/unified")


@pytest.fixture
def cgroup():
    path = CGROUP2 / f"sparkd-test-psi-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    yield path
    if path.exists():
        path.rmdir()


def _close(state):
    if state.fd is not None:
        os.close(state.fd)


@pytest.mark.parametrize("where", ["cgroup", "system"])
def test_configured_trigger_registers_or_falls_back_to_a_2s_window(where, cgroup):
    path = str(cgroup / "memory.pressure") if where == "cgroup" else "/proc/pressure/memory"
    state = register_trigger(path, TriggerSpec("warn", "some", 150_000, 1_000_000))
    try:
        assert state.fd is not None, state.reason
        if state.mode == "trigger":  # CAP_SYS_RESOURCE (a real host's root)
            assert (state.stall_us, state.window_us) == (150_000, 1_000_000)
        else:  # this machine: root without CAP_SYS_RESOURCE, windows under 2 s are EINVAL
            assert state.mode == "trigger-fallback"
            assert (state.stall_us, state.window_us) == (300_000, 2_000_000)
            assert "Invalid argument" in state.reason and "CAP_SYS_RESOURCE" in state.reason
    finally:
        _close(state)


def test_a_trigger_the_kernel_refuses_outright_falls_back_to_polling(cgroup):
    # 12 s is beyond the kernel's 10 s window limit and already a 2 s multiple: nothing to retry
    state = register_trigger(str(cgroup / "memory.pressure"), TriggerSpec("big", "full", 100_000, 12_000_000))
    assert (state.mode, state.fd) == ("poll", None)
    assert "full 100000 12000000 refused by" in state.reason and "Invalid argument" in state.reason


def test_missing_file_is_reported_as_polling_with_the_cause(tmp_path):
    state = register_trigger(str(tmp_path / "nope"), TriggerSpec("x", "some", 150_000, 1_000_000))
    assert state.mode == "poll" and "No such file" in state.reason


def test_detector_samples_and_ends_gone_when_the_cgroup_is_removed(cgroup):
    samples = []
    det = PsiDetector(str(cgroup / "memory.pressure"), [TriggerSpec("warn", "some", 150_000, 1_000_000),
                                                        TriggerSpec("stop", "full", 500_000, 1_000_000)],
                      samples.append, interval_seconds=0.1)

    async def scenario():
        task = asyncio.create_task(det.run())
        while len(samples) < 3:
            await asyncio.sleep(0.05)
        cgroup.rmdir()
        return await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)

    (result,) = asyncio.run(scenario())
    assert isinstance(result, PressureGone)
    assert [t["mode"] for t in det.modes()] in (["trigger", "trigger"], ["trigger-fallback", "trigger-fallback"])
    assert set(samples[0].total_us) == {"some", "full"} and samples[0].path.endswith("memory.pressure")
