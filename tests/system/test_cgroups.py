"""sparkd.system.cgroups: parsers with literal inputs, the rest against this machine's cgroup2 tree."""

import os
import signal
import subprocess
import time
import uuid

import pytest

from sparkd.system import cgroups

MOUNTINFO_HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
MOUNTINFO_PURE = """\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
30 22 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
"""
MOUNTINFO_ODD = "50 22 0:40 / /mnt/my\\040cgroups rw - cgroup2 none rw\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        (MOUNTINFO_HYBRID, "/sys/fs/cgroup/unified"),
        (MOUNTINFO_PURE, "/sys/fs/cgroup"),
        (MOUNTINFO_ODD, "/mnt/my cgroups"),
        ("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n", None),
    ],
)
def test_find_cgroup2_mount(tmp_path, text, expected):
    path = tmp_path / "mountinfo"
    path.write_text(text)
    assert cgroups.find_cgroup2_mount(str(path)) == expected


def test_cgroup_of_pid_reads_the_v2_line(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("4:memory:/x\n0::/sparkd.slice/sparkd-a.service\n")
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "cgroup").write_text("4:memory:/x\n1:name=systemd:/\n")
    assert cgroups.cgroup_of_pid(42, proc_root=str(tmp_path)) == "/sparkd.slice/sparkd-a.service"
    assert cgroups.cgroup_of_pid(43, proc_root=str(tmp_path)) is None
    with pytest.raises(FileNotFoundError):
        cgroups.cgroup_of_pid(44, proc_root=str(tmp_path))


def test_parse_pressure():
    text = (
        "some avg10=53.10 avg60=20.00 avg300=4.50 total=123456\n"
        "full avg10=25.00 avg60=9.75 avg300=1.00 total=6543\n"
    )
    assert cgroups.parse_pressure(text) == {
        "some": {"avg10": 53.1, "avg60": 20.0, "avg300": 4.5, "total": 123456},
        "full": {"avg10": 25.0, "avg60": 9.75, "avg300": 1.0, "total": 6543},
    }


def test_readers_of_a_fake_cgroup(tmp_path):
    cg = tmp_path / "svc"
    cg.mkdir()
    (cg / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 2\noom_group_kill 1\n")
    (cg / "memory.stat").write_text("anon 4096\nfile 8192\n")
    (cg / "memory.current").write_text("268431360\n")
    (cg / "memory.pressure").write_text("some avg10=1.00 avg60=0.00 avg300=0.00 total=7\n")
    assert cgroups.read_memory_events(str(cg)) == {
        "low": 0, "high": 0, "max": 12, "oom": 1, "oom_kill": 2, "oom_group_kill": 1
    }
    assert cgroups.read_memory_stat(str(cg)) == {"anon": 4096, "file": 8192}
    assert cgroups.memory_current(str(cg)) == 268431360
    assert cgroups.read_pressure(str(cg))["some"]["total"] == 7
    # memory.peak absent in an existing cgroup: the controller file is missing, not the cgroup
    assert cgroups.memory_peak(str(cg)) is None
    assert cgroups.read_pressure(str(cg), "io") is None
    with pytest.raises(FileNotFoundError):
        cgroups.read_memory_events(str(tmp_path / "gone"))


# -- the real cgroup2 tree (fixtures `mount` and `test_cgroup` in tests/conftest.py) ----------


def _spawn_stubborn(cgroup: str, tmp_path) -> subprocess.Popen:
    """A shell in cgroup (placed before exec) that ignores SIGTERM; returns once the trap is set."""

    def join():
        cgroups.write_text(cgroup, "cgroup.procs", str(os.getpid()))

    ready = tmp_path / f"ready-{uuid.uuid4().hex[:6]}"
    script = f"trap '' TERM; : > {ready}; while :; do sleep 1; done"
    proc = subprocess.Popen(["sh", "-c", script], preexec_fn=join)
    deadline = time.monotonic() + 30  # a hang guard, not a timing assertion
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the test shell did not start"
        time.sleep(0.01)
    return proc


@pytest.mark.root
def test_enable_controllers_down_the_chain(mount, test_cgroup):
    leaf = os.path.join(test_cgroup, "a", "b")
    os.makedirs(leaf)
    offered = cgroups.controllers(mount)
    enabled_at_mount = cgroups.subtree_control(mount)
    # hugetlb (offered on the hybrid CI hosts) exercises the writes without touching memory
    wanted = {"memory"} | ({"hugetlb"} if "hugetlb" in offered else set())
    try:
        missing = cgroups.enable_controllers(leaf, wanted, mount)
        assert missing == wanted - offered
        assert wanted - missing <= cgroups.controllers(leaf)
        # enabling again writes nothing new and reports the same
        assert cgroups.enable_controllers(leaf, wanted, mount) == missing
    finally:
        cgroups.remove_cgroup(os.path.join(test_cgroup, "a"))
        for name in ("hugetlb",):
            if name in wanted and name not in enabled_at_mount:
                cgroups.write_text(test_cgroup, "cgroup.subtree_control", f"-{name}")
                cgroups.write_text(mount, "cgroup.subtree_control", f"-{name}")
    with pytest.raises(ValueError):
        cgroups.enable_controllers("/tmp", {"memory"}, mount)


@pytest.mark.root
def test_pid_placement_signal_and_fallback_kill(mount, test_cgroup, tmp_path):
    inner = os.path.join(test_cgroup, "inner")
    os.mkdir(inner)
    # Both ignore SIGTERM, so only a SIGKILL (here: the fallback without cgroup.kill) ends them.
    outer_proc = _spawn_stubborn(test_cgroup, tmp_path)
    inner_proc = _spawn_stubborn(inner, tmp_path)
    try:
        rel = "/" + os.path.relpath(inner, mount)
        assert cgroups.cgroup_of_pid(inner_proc.pid) == rel
        pids = cgroups.procs(test_cgroup, recursive=True)
        assert {outer_proc.pid, inner_proc.pid} <= set(pids)
        direct = cgroups.procs(test_cgroup)
        assert outer_proc.pid in direct and inner_proc.pid not in direct
        assert cgroups.is_populated(test_cgroup)
        assert cgroups.signal_cgroup(test_cgroup, signal.SIGTERM) >= 2
        assert not cgroups.wait_until_empty(test_cgroup, 0.2)  # SIGTERM ignored: still there
        cgroups.kill_cgroup(test_cgroup, use_kill_file=False)
        assert cgroups.wait_until_empty(test_cgroup, 10)
    finally:
        for proc in (outer_proc, inner_proc):
            proc.kill()
            proc.wait()
    assert outer_proc.returncode == -signal.SIGKILL
    assert inner_proc.returncode == -signal.SIGKILL


@pytest.mark.root
def test_kill_file_and_pressure_of_a_real_cgroup(test_cgroup, tmp_path):
    proc = _spawn_stubborn(test_cgroup, tmp_path)
    try:
        pressure = cgroups.read_pressure(test_cgroup)
        assert set(pressure) == {"some", "full"}
        assert set(pressure["some"]) == {"avg10", "avg60", "avg300", "total"}
        cgroups.kill_cgroup(test_cgroup)
        assert cgroups.wait_until_empty(test_cgroup, 10)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    events = cgroups.read_memory_events(test_cgroup)
    if "memory" in cgroups.controllers(test_cgroup):
        assert events is not None and "oom_kill" in events
    else:
        assert events is None  # no memory controller here: reported as absent, not as zeros

