"""Shared test setup: markers that skip with a reason where the real part cannot exist."""

import os
import shutil
import uuid

import pytest

from sparkd.system import cgroups


def _has_cuda() -> bool:
    # Importing torch costs seconds; without an NVIDIA driver node there is nothing to ask it.
    if not os.path.exists("/dev/nvidiactl") and not os.path.exists("/proc/driver/nvidia"):
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    reasons = {}
    if not _has_cuda():
        reasons["gpu"] = "no CUDA GPU here; runs on the device box"
    if os.geteuid() != 0:
        reasons["root"] = "needs root"
    if os.geteuid() != 0 or not shutil.which("unshare") or not os.path.exists("/lib/systemd/systemd"):
        reasons["systemd"] = "needs root, unshare and /lib/systemd/systemd to boot a sandboxed systemd"
    for item in items:
        for mark, why in reasons.items():
            if mark in item.keywords:
                item.add_marker(pytest.mark.skip(reason=why))
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))


MACHINE_MARKS = ("root", "systemd", "oracle")


def _worker_group(item) -> str:
    """Which tests share a pytest-xdist worker (scripts/test runs two, --dist loadgroup; a group runs
    on one worker, in file order). The engine's computing tests go a whole file to a worker (its
    module fixtures made once); every test that touches the machine (cgroups, a systemd box,
    /dev/kmsg, dpkg, ports, llama.cpp's build: the files outside tests/engine and the marked ones)
    stays in one group, one at a time as without xdist."""
    path = str(item.path)
    if os.sep + os.path.join("tests", "engine") + os.sep in path and not any(m in item.keywords for m in MACHINE_MARKS):
        return os.path.relpath(path, str(item.config.rootpath))
    return "machine"


@pytest.fixture(scope="module")
def systemd_box(request, tmp_path_factory):
    """A real systemd booted in throwaway namespaces for one test module (marker `systemd`).

    box.share_dir is a host folder visible at the same path inside the box: put scripts,
    models and policies the box must see there. The box is torn down even when tests fail.
    A module that writes much inside the box sets SDBOX_OVERLAY_SIZE (e.g. "3g").
    """
    from sdbox import OVERLAY_SIZE, SystemdBox

    box = SystemdBox(tmp_path_factory.mktemp("sdbox-state"), tmp_path_factory.mktemp("sdbox-share"),
                     overlay_size=getattr(request.module, "SDBOX_OVERLAY_SIZE", OVERLAY_SIZE))
    box.start()
    try:
        yield box
    finally:
        box.stop()


# -- the real cgroup2 tree, for tests that place processes in cgroups ---------------------------


@pytest.fixture
def mount():
    found = cgroups.find_cgroup2_mount()
    if found is None:
        pytest.skip("no cgroup2 mount on this machine")
    return found


@pytest.fixture
def test_cgroup(mount):
    path = os.path.join(mount, f"sparkd-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    yield path
    leftover = cgroups.procs(path, recursive=True)
    cgroups.kill_cgroup(path)
    cgroups.wait_until_empty(path, 10)
    cgroups.remove_cgroup(path)
    assert not os.path.exists(path)
    assert leftover == [], f"test left processes behind: {leftover}"

