"""The cgroupfs backend against this machine's real cgroup2 tree, with real processes.

Each test gets its own cgroup root under the cgroup2 mount (sparkd-test-<random>), removed after;
the fixture fails the test if a process or cgroup is left behind. On hybrid CI hosts there is no
memory controller, so the tests assert the "not enforced" report; the OOM test runs where the
memory controller exists (the GPU box, pure cgroup v2) and skips with the reason elsewhere.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sparkd.errors import PlacementError
from sparkd.placement.base import ServiceSpec
from sparkd.placement.cgroupfs import CgroupfsPlacement
from sparkd.system import cgroups

pytestmark = pytest.mark.root

REPO = str(Path(__file__).resolve().parents[2])
HANG_GUARD_SECONDS = 60  # only to turn a hang into a failure; nothing here asserts a duration


@pytest.fixture
def root(test_cgroup):
    """A test cgroup root (tests/conftest.py) that must also end with no service cgroups."""
    yield test_cgroup
    services = _subdirs(os.path.join(test_cgroup, "sparkd.slice"))
    assert services == [], f"service cgroups left behind: {services}"


@pytest.fixture
def state_dir():
    # Not pytest's tmp_path: its parents are 0700 and the user-switch tests need to reach it.
    path = tempfile.mkdtemp(prefix="sparkd-state-")
    os.chmod(path, 0o777)
    yield path
    subprocess.run(["rm", "-rf", path], check=True)


@pytest.fixture
async def placement(root, state_dir):
    events = []
    backend = CgroupfsPlacement(cgroup_root=root, state_dir=state_dir, on_change=events.append,
                                poll_interval_seconds=0.02)
    backend.events = events
    yield backend
    await backend.close()


def _subdirs(path):
    return [e.name for e in os.scandir(path) if e.is_dir()] if os.path.isdir(path) else []


def _spec(name="svc", argv=("sleep", "1000"), **kw):
    return ServiceSpec(name=name, argv=list(argv), memory_max_bytes=256 << 20, **kw)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _until(predicate, what):
    deadline = asyncio.get_running_loop().time() + HANG_GUARD_SECONDS
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.02)


async def _final(backend, name="svc"):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANG_GUARD_SECONDS
    while True:
        status = await backend.status(name)
        if status is not None and status.active_state in ("inactive", "failed"):
            return status
        assert loop.time() < deadline, f"{name} did not end"
        await asyncio.sleep(0.02)


def _rel(mount, path):
    return "/" + os.path.relpath(path, mount)


# -- placement and the enforcement report -------------------------------------------------------


async def test_the_service_itself_runs_in_its_cgroup_from_exec(placement, mount, root):
    # cat reads its own /proc/self/cgroup right after exec: it was inside before it ran.
    status = await placement.start(_spec(argv=["cat", "/proc/self/cgroup"]))
    expected = os.path.join(root, "sparkd.slice", "sparkd-svc.service")
    assert status.cgroup == expected and status.active_state == "active"
    final = await _final(placement)
    assert (final.result, final.exec_main_status) == ("success", 0)
    lines = Path(placement.log_path("svc")).read_text().splitlines()
    assert f"0::{_rel(mount, expected)}" in lines
    assert not os.path.exists(expected)


async def test_children_are_in_the_cgroup_and_reported(placement, mount, state_dir):
    child_file = Path(state_dir) / "child"
    status = await placement.start(_spec(argv=["sh", "-c", f"sleep 1000 & echo $! > {child_file}; wait"]))
    await _until(lambda: child_file.exists() and child_file.read_text().strip(), "the child pid")
    child = int(child_file.read_text())
    assert cgroups.cgroup_of_pid(child) == _rel(mount, status.cgroup)
    assert cgroups.cgroup_of_pid(status.main_pid) == _rel(mount, status.cgroup)
    assert {child, status.main_pid} <= set(cgroups.procs(status.cgroup))
    final = await placement.stop("svc", 30)
    assert final.active_state == "inactive" and final.result == "success"
    assert not _alive(child) and not _alive(status.main_pid)
    assert [e.active_state for e in placement.events] == ["active", "deactivating", "inactive"]


async def test_memory_limit_enforcement_is_reported_never_silent(placement, mount):
    status = await placement.start(_spec(memory_high_bytes=192 << 20))
    try:
        if "memory" in cgroups.controllers(mount):
            assert placement.memory_enforced and status.memory_enforced
            assert cgroups.read_text(status.cgroup, "memory.max").strip() == str(256 << 20)
            assert cgroups.read_text(status.cgroup, "memory.high").strip() == str(192 << 20)
            assert cgroups.read_text(status.cgroup, "memory.swap.max").strip() == "0"
            assert cgroups.read_text(status.cgroup, "memory.oom.group").strip() == "1"
        else:
            assert not placement.memory_enforced and not status.memory_enforced
            assert "memory controller is not available" in placement.why_not_enforced
            assert "NOT enforced" in status.message
            assert not os.path.exists(os.path.join(status.cgroup, "memory.max"))
            assert not os.path.exists(os.path.join(status.cgroup, "memory.high"))
        assert (status.memory_max_bytes, status.memory_high_bytes) == (256 << 20, 192 << 20)
    finally:
        final = await placement.stop("svc", 30)
    assert placement.memory_enforced or "NOT enforced" in final.message


# -- stop ---------------------------------------------------------------------------------------


async def test_stop_sends_sigterm_and_removes_the_cgroup(placement, root):
    status = await placement.start(_spec())
    final = await placement.stop("svc", 30)
    assert (final.active_state, final.result, final.exec_main_status) == ("inactive", "success", signal.SIGTERM)
    assert not _alive(status.main_pid)
    assert _subdirs(os.path.join(root, "sparkd.slice")) == []
    assert await placement.stop("svc", 30) == final  # stopping again only reports


async def test_sigterm_ignored_then_cgroup_kill_after_stop_timeout(placement, state_dir):
    child_file = Path(state_dir) / "child"
    script = f"trap '' TERM; sleep 1000 & echo $! > {child_file}; wait; wait"
    status = await placement.start(_spec(argv=["sh", "-c", script]))
    await _until(lambda: child_file.exists() and child_file.read_text().strip(), "the trap and child")
    child = int(child_file.read_text())
    final = await placement.stop("svc", 0.5)
    assert (final.active_state, final.result) == ("failed", "timeout")
    assert "ignored SIGTERM" in final.message
    assert not _alive(child) and not _alive(status.main_pid)
    assert not os.path.exists(status.cgroup)
    assert [e.sub_state for e in placement.events][1:3] == ["stop-sigterm", "stop-sigkill"]


async def test_leftover_children_die_with_the_main_process(placement, state_dir):
    child_file = Path(state_dir) / "child"
    await placement.start(_spec(argv=["sh", "-c", f"sleep 1000 & echo $! > {child_file}; exit 0"]))
    final = await _final(placement)
    assert (final.result, final.exec_main_status) == ("success", 0)
    assert not _alive(int(child_file.read_text()))
    assert not os.path.exists(final.cgroup)


async def test_stop_of_an_unknown_service_is_a_clear_error(placement):
    with pytest.raises(PlacementError, match="could not stop nope: sparkd placed no such service"):
        await placement.stop("nope", 1)


# -- results ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, state, result, exec_status",
    [
        ("exit 0", "inactive", "success", 0),
        ("exit 7", "failed", "exit-code", 7),
        ("kill -USR1 $$", "failed", "signal", signal.SIGUSR1),
    ],
)
async def test_exit_results(placement, script, state, result, exec_status):
    await placement.start(_spec(argv=["sh", "-c", script]))
    final = await _final(placement)
    assert (final.active_state, final.result, final.exec_main_status) == (state, result, exec_status)
    assert not os.path.exists(final.cgroup)
    assert [e.active_state for e in placement.events] == ["active", state]  # never restarted


async def test_environment_working_directory_and_user(placement, state_dir):
    out = Path(state_dir) / "seen"
    script = f'echo "$GREETING $(pwd) $(id -un)" > {out}'
    spec = _spec(argv=["sh", "-c", script], environment={"GREETING": "hello"},
                 working_directory="/tmp", user="nobody")
    await placement.start(spec)
    final = await _final(placement)
    assert final.result == "success", final.message
    assert out.read_text().split() == ["hello", "/tmp", "nobody"]


# -- failed starts leave nothing behind ---------------------------------------------------------


def _nothing_left(root):
    assert _subdirs(root) == [] and not cgroups.is_populated(root)


@pytest.mark.parametrize(
    "spec, message",
    [
        (_spec(argv=["/nonexistent/engine"]), "/nonexistent/engine is not an executable file"),
        (_spec(argv=["no-such-engine-xyz"]), "no-such-engine-xyz is not an executable file"),
        (_spec(working_directory="/nonexistent"), "working directory /nonexistent does not exist"),
        (_spec(user="no-such-user-xyz"), "no such user 'no-such-user-xyz'"),
        (_spec(restart="always"), "never restarts services"),
        (_spec(argv=[]), "the command is empty"),
    ],
)
async def test_bad_specs_are_refused_before_anything_exists(placement, root, spec, message):
    with pytest.raises(PlacementError, match=message):
        await placement.start(spec)
    _nothing_left(root)
    assert await placement.status("svc") is None


async def test_exec_failures_inside_the_launcher_leave_nothing(placement, root, state_dir):
    garbage = Path(state_dir) / "not-a-program"
    garbage.write_bytes(b"\x00\x01garbage")
    garbage.chmod(0o755)
    with pytest.raises(PlacementError, match=f"could not execute {garbage}: Exec format error"):
        await placement.start(_spec(argv=[str(garbage)]))
    _nothing_left(root)
    # a program only root may run, started as nobody: permission denied at exec
    private = Path(state_dir) / "private"
    private.mkdir(mode=0o700)
    os.symlink("/bin/true", private / "tool")
    with pytest.raises(PlacementError, match="could not execute .*tool: Permission denied"):
        await placement.start(_spec(argv=[str(private / "tool")], user="nobody"))
    _nothing_left(root)


@pytest.mark.parametrize("bad_root", ["/nonexistent/cgroup", "TMP"])
async def test_a_root_that_is_not_a_cgroup_is_refused(state_dir, bad_root):
    bad_root = tempfile.mkdtemp() if bad_root == "TMP" else bad_root
    backend = CgroupfsPlacement(cgroup_root=bad_root, state_dir=state_dir)
    with pytest.raises(PlacementError, match=f"cgroup root {bad_root} is not a cgroup v2 directory"):
        await backend.start(_spec())
    if bad_root.startswith("/tmp"):
        assert os.listdir(bad_root) == []
        os.rmdir(bad_root)
    assert not backend.memory_enforced and bad_root in backend.why_not_enforced


async def test_unwritable_cgroup_root_permission_denied(root, state_dir):
    # sparkd not running as root: the cgroup tree is root's and the mkdir is refused. The
    # effective uid is dropped in-process (root may take it back), so no other Python is needed.
    backend = CgroupfsPlacement(cgroup_root=root, state_dir=state_dir)
    os.setegid(65534)
    os.seteuid(65534)
    try:
        with pytest.raises(PlacementError) as ei:
            await backend.start(ServiceSpec(name="svc", argv=["sleep", "1000"], memory_max_bytes=1 << 28))
    finally:
        os.seteuid(0)
        os.setegid(0)
    assert f"could not create cgroup {root}/sparkd.slice: Permission denied" in str(ei.value)
    assert "run as root or delegate it" in str(ei.value)
    _nothing_left(root)


async def test_read_only_cgroup_mount_is_refused(root, state_dir):
    # What a container sees when /sys/fs/cgroup is mounted read-only (Docker's default).
    view = tempfile.mkdtemp(prefix="sparkd-ro-")
    subprocess.run(["mount", "--bind", root, view], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", view], check=True)
        backend = CgroupfsPlacement(cgroup_root=view, state_dir=state_dir)
        with pytest.raises(PlacementError, match=f"could not create cgroup {view}/sparkd.slice: Read-only file system"):
            await backend.start(_spec())
    finally:
        subprocess.run(["umount", view], check=True)
        os.rmdir(view)
    _nothing_left(root)


# -- re-adoption after a sparkd restart ---------------------------------------------------------

START_AND_LEAVE = """
import asyncio, json, sys
from sparkd.placement.base import ServiceSpec
from sparkd.placement.cgroupfs import CgroupfsPlacement
async def main():
    backend = CgroupfsPlacement(cgroup_root=sys.argv[1], state_dir=sys.argv[2])
    spec = ServiceSpec(name="svc", argv=json.loads(sys.argv[3]), memory_max_bytes=1 << 28, memory_high_bytes=1 << 27)
    status = await backend.start(spec)
    await backend.close()  # sparkd goes away; the service must not
    print(json.dumps(status.to_dict()))
asyncio.run(main())
"""


def _first_sparkd(root, state_dir, argv):
    """Start a service from another process that then exits: a sparkd that went away."""
    out = subprocess.run([sys.executable, "-c", START_AND_LEAVE, root, state_dir, json.dumps(argv)],
                         env={"PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def test_adopt_after_restart_then_notice_the_exit(placement, root, state_dir):
    go = Path(state_dir) / "go"
    first = _first_sparkd(root, state_dir, ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; exit 7"])
    assert _alive(first["main_pid"])
    adopted = await placement.adopt()
    assert [(s.name, s.active_state, s.main_pid) for s in adopted] == [("svc", "active", first["main_pid"])]
    assert adopted[0].cgroup == first["cgroup"]
    assert (adopted[0].memory_max_bytes, adopted[0].memory_high_bytes) == (1 << 28, 1 << 27)  # from the saved state
    assert await placement.adopt() == []  # known now: never adopted twice
    with pytest.raises(PlacementError, match="already running"):
        await placement.start(_spec())
    assert cgroups.procs(first["cgroup"])  # the refused start touched nothing
    go.touch()
    final = await _final(placement)
    # sparkd is not the parent any more; the launcher's record still gives the exit status
    assert (final.active_state, final.result, final.exec_main_status) == ("failed", "exit-code", 7)
    assert not os.path.exists(first["cgroup"])


async def test_an_adopted_service_stops_like_its_own(placement, state_dir):
    first = _first_sparkd(placement.cgroup_root, state_dir, ["sleep", "1000"])
    [adopted] = await placement.adopt()
    assert adopted.main_pid == first["main_pid"]
    final = await placement.stop("svc", 30)
    assert (final.active_state, final.result, final.exec_main_status) == ("inactive", "success", signal.SIGTERM)
    assert not _alive(first["main_pid"]) and not os.path.exists(first["cgroup"])


async def test_adopt_a_service_that_ended_while_sparkd_was_away(placement, state_dir):
    go = Path(state_dir) / "go"
    first = _first_sparkd(placement.cgroup_root, state_dir,
                          ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; exit 5"])
    go.touch()
    assert cgroups.wait_until_empty(first["cgroup"], HANG_GUARD_SECONDS)
    adopted = await placement.adopt()
    assert [(s.active_state, s.result, s.exec_main_status) for s in adopted] == [("failed", "exit-code", 5)]
    assert not os.path.exists(first["cgroup"])


async def test_a_second_instance_does_not_duplicate_a_running_service(placement, root, state_dir):
    status = await placement.start(_spec())
    other = CgroupfsPlacement(cgroup_root=root, state_dir=state_dir)
    with pytest.raises(PlacementError, match="already has processes"):
        await other.start(_spec())
    assert cgroups.procs(status.cgroup) and _alive(status.main_pid)
    # the refused start did not touch the running service's saved state either
    seen = await other.adopt()
    assert [(s.main_pid, s.memory_max_bytes) for s in seen] == [(status.main_pid, 256 << 20)]
    await other.close()
    await placement.stop("svc", 30)


# -- the memory controller (pure cgroup v2: the GPU box) ----------------------------------------

ALLOCATE_512_MIB = "b = bytearray(b'x') * (512 << 20); import time; time.sleep(1000)"


async def test_oom_kill_stops_the_service_and_is_not_restarted(placement, mount):
    if "memory" not in cgroups.controllers(mount):
        pytest.skip(f"no memory controller in {mount}/cgroup.controllers (hybrid host); runs on the GPU box")
    spec = _spec(argv=[sys.executable, "-c", ALLOCATE_512_MIB])
    status = await placement.start(spec)
    assert status.memory_enforced
    final = await _final(placement)
    assert (final.active_state, final.result) == ("failed", "oom-kill"), final.message
    assert not os.path.exists(status.cgroup)
    assert [e.active_state for e in placement.events].count("active") == 1  # never restarted
    assert "memory.events at the OOM kill: oom " in final.message
    print(f"OOM result: {final.to_dict()}")
