"""End to end on the real cgroup2 tree: a real sparkd (cgroupfs placement), a `sleep` service,
driven by sparkctl through the real socket; kill -9 and re-adoption; SIGTERM leaves the service
running; socket permissions."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sparkd_harness import (
    CGROUP2,
    Sparkd,
    pid_alive,
    python_env,
    remove_cgroup_tree,
    service,
    sparkctl,
    status_json,
)

pytestmark = pytest.mark.root




@pytest.fixture
def world(tmp_path):
    """A test cgroup root, a run dir others may traverse (for the permission test), a policy."""
    cgroup_root = CGROUP2 / f"sparkd-test-daemon-{os.getpid()}-{time.monotonic_ns()}"
    cgroup_root.mkdir()
    run_dir = Path(tempfile.mkdtemp(prefix="sparkd-run-", dir="/tmp"))
    run_dir.chmod(0o755)
    daemons: list[Sparkd] = []
    yield {"tmp": tmp_path, "cgroup_root": cgroup_root, "run": run_dir, "daemons": daemons}
    for d in daemons:
        d.ensure_dead()
    remove_cgroup_tree(cgroup_root)
    shutil.rmtree(run_dir, ignore_errors=True)


def _policy(world, **daemon_extra) -> Path:
    import yaml

    daemon = {"placement": "cgroupfs", "cgroup_root": str(world["cgroup_root"]), "state_dir": str(world["tmp"] / "state"),
              "control_socket": str(world["run"] / "sock" / "control.sock"), **daemon_extra}
    policy = {
        "daemon": daemon,
        "guards": {"reserve": "64M", "competitors": []},
        "services": {
            "sleeper": {"engine": {"command": ["sleep", "10000"]}, "memory_max": "256M", "memory_high": "192M",
                        "stop_timeout": "5s"},
            "huge": {"engine": {"command": ["sleep", "10000"]}, "memory_max": "64T"},
        },
    }
    path = world["tmp"] / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def _sparkd(world, policy: Path) -> Sparkd:
    d = Sparkd(policy, world["run"] / "sock" / "control.sock", world["tmp"] / "sparkd.log")
    world["daemons"].append(d)
    return d.start()


def _sleep_pids(cgroup: str) -> list[int]:
    return [int(p) for p in (Path(cgroup) / "cgroup.procs").read_text().split()
            if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"]


def test_start_status_kill9_readopt_stop(world):
    policy = _policy(world)
    sock = world["run"] / "sock" / "control.sock"
    d = _sparkd(world, policy)
    assert (sock.stat().st_mode & 0o777) == 0o660

    out = sparkctl(sock, "start", "sleeper")
    assert out.returncode == 0, out.stderr + out.stdout
    assert "sleeper started (sparkd-sleeper.service)" in out.stdout
    # Hybrid host (CI): said, never silent. Pure cgroup v2 (GPU box): enforced, no warning.
    assert ("NOT enforced" in out.stdout) is not _has_memory_controller()

    st = service(status_json(sock), "sleeper")
    assert (st["state"], st["backend"], st["unit"]) == ("active", "cgroupfs", "sparkd-sleeper.service")
    assert st["cgroup"] == str(world["cgroup_root"] / "sparkd.slice" / "sparkd-sleeper.service")
    [pid] = _sleep_pids(st["cgroup"])
    assert st["memory_enforced"] is _has_memory_controller()
    assert st["memory_high_policy_bytes"] == 192 << 20
    assert st["memory_high_bytes"] == (192 << 20 if _has_memory_controller() else None)  # the cgroup's memory.high
    assert st["psi_some_avg10"] is not None  # memory.pressure exists even without the controller
    human = sparkctl(sock, "status")
    assert human.returncode == 0 and "sleeper" in human.stdout and "(high 192.0M)" in human.stdout
    assert ("not enforced" in human.stdout) is not _has_memory_controller()
    if not status_json(sock)["daemon"]["gpu_available"]:
        assert "GPU use not shown: no NVIDIA driver" in human.stdout

    d.kill9()
    assert pid_alive(pid)
    d = _sparkd(world, policy)
    assert "event=adopted service=sleeper" in d.log_text()
    st = service(status_json(sock), "sleeper")
    assert st["state"] == "active" and _sleep_pids(st["cgroup"]) == [pid]

    again = sparkctl(sock, "start", "sleeper")
    assert again.returncode == 0 and "already running" in again.stdout
    assert _sleep_pids(st["cgroup"]) == [pid]  # not duplicated

    out = sparkctl(sock, "stop", "sleeper")
    assert out.returncode == 0, out.stderr + out.stdout
    assert "sleeper stopped" in out.stdout
    assert not pid_alive(pid)
    st = service(status_json(sock), "sleeper")
    assert st["state"] in ("inactive", "failed") and st["last_result"] is not None

    assert d.signal(signal.SIGTERM) == 0
    assert not sock.exists()


def test_sigterm_leaves_services_running_and_refusal_is_exit_1(world):
    policy = _policy(world)
    sock = world["run"] / "sock" / "control.sock"
    d = _sparkd(world, policy)
    refused = sparkctl(sock, "start", "huge")
    assert refused.returncode == 1
    assert "could not start service huge: refused by guards" in refused.stdout
    assert "services.huge.memory_max" in refused.stdout
    assert not (world["cgroup_root"] / "sparkd.slice" / "sparkd-huge.service").exists()  # nothing half-started
    pre = sparkctl(sock, "preflight", "huge")
    assert pre.returncode == 1 and "REFUSED" in pre.stdout
    assert sparkctl(sock, "preflight", "sleeper").returncode == 0
    unknown = sparkctl(sock, "start", "nosuch")
    assert unknown.returncode == 1 and "could not find service 'nosuch' in the policy" in unknown.stdout

    assert sparkctl(sock, "start", "sleeper").returncode == 0
    [pid] = _sleep_pids(service(status_json(sock), "sleeper")["cgroup"])
    assert d.signal(signal.SIGTERM) == 0
    assert "event=leaving_services_running services=sleeper" in d.log_text()
    assert pid_alive(pid)

    d = _sparkd(world, policy)
    assert service(status_json(sock), "sleeper")["main_pid"] is not None
    assert sparkctl(sock, "stop", "sleeper").returncode == 0
    assert not pid_alive(pid)


def test_stop_services_on_exit(world):
    policy = _policy(world, stop_services_on_exit=True)
    sock = world["run"] / "sock" / "control.sock"
    d = _sparkd(world, policy)
    assert sparkctl(sock, "start", "sleeper").returncode == 0
    [pid] = _sleep_pids(service(status_json(sock), "sleeper")["cgroup"])
    assert d.signal(signal.SIGTERM) == 0
    assert not pid_alive(pid)


def _as(user: str, group: str) -> list[str]:
    return ["setpriv", f"--reuid={user}", f"--regid={group}", "--clear-groups"]


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv")
def test_socket_refuses_others_and_admits_the_group(world):
    group = grp.getgrgid(pwd.getpwnam("nobody").pw_gid).gr_name
    policy = _policy(world, socket_group=group)
    sock = world["run"] / "sock" / "control.sock"
    _sparkd(world, policy)
    st = sock.stat()
    assert (st.st_mode & 0o777, st.st_gid) == (0o660, grp.getgrnam(group).gr_gid)
    other = next(g.gr_name for g in grp.getgrall() if g.gr_name not in (group, "root"))
    refused = sparkctl(sock, "status", prefix=_as("nobody", other))
    assert refused.returncode == 1
    assert f"could not connect to sparkd at {sock}: permission denied" in refused.stderr
    admitted = sparkctl(sock, "status", prefix=_as("nobody", group))
    assert admitted.returncode == 0, admitted.stderr


def test_missing_socket_group_fails_startup_cleanly(world):
    policy = _policy(world, socket_group="no-such-group-sparkd")
    out = subprocess.run([sys.executable, "-m", "sparkd.cli.daemon", "--policy", str(policy)], env=python_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "group 'no-such-group-sparkd' (daemon.socket_group) does not exist" in out.stderr
    assert not (world["run"] / "sock" / "control.sock").exists()


def test_service_that_ended_while_sparkd_was_away_is_reported_not_restarted(world):
    policy = _policy(world)
    sock = world["run"] / "sock" / "control.sock"
    d = _sparkd(world, policy)
    assert sparkctl(sock, "start", "sleeper").returncode == 0
    cgroup = service(status_json(sock), "sleeper")["cgroup"]
    [pid] = _sleep_pids(cgroup)
    d.kill9()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(pid):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    _sparkd(world, policy)
    st = service(status_json(sock), "sleeper")
    assert st["state"] in ("inactive", "failed")
    assert st["last_result"] in ("signal", "unknown"), st
    assert not Path(cgroup).exists() or _sleep_pids(cgroup) == []


def test_sd_notify_ready_and_stopping(world):
    import socket as pysocket

    policy = _policy(world)
    notify_path = world["tmp"] / "notify.sock"
    rx = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_DGRAM)
    rx.bind(str(notify_path))
    rx.settimeout(60)
    d = Sparkd(policy, world["run"] / "sock" / "control.sock", world["tmp"] / "sparkd.log")
    world["daemons"].append(d)
    os.environ["NOTIFY_SOCKET"] = str(notify_path)
    try:
        d.start()
    finally:
        del os.environ["NOTIFY_SOCKET"]
    with rx:
        ready = rx.recv(4096).decode()
        assert "READY=1" in ready.splitlines()
        limits = "enforced" if _has_memory_controller() else "NOT enforced"
        assert f"STATUS=0 service(s) running; placement cgroupfs; memory limits {limits}" in ready.splitlines()
        assert d.signal(signal.SIGTERM) == 0
        assert "STOPPING=1" in rx.recv(4096).decode().splitlines()


def test_corrupt_state_file_fails_startup_with_the_path(world):
    policy = _policy(world)
    state = world["tmp"] / "state"
    state.mkdir()
    (state / "state.json").write_text("{half a file")
    out = subprocess.run([sys.executable, "-m", "sparkd.cli.daemon", "--policy", str(policy)], env=python_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"could not parse state {state / 'state.json'}" in out.stderr and "move it aside" in out.stderr
    assert not (world["run"] / "sock" / "control.sock").exists()


def test_bad_policy_fails_startup(world):
    bad = world["tmp"] / "bad.yaml"
    bad.write_text("daemon: {placement: docker}\n")
    out = subprocess.run([sys.executable, "-m", "sparkd.cli.daemon", "--policy", str(bad)], env=python_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and f"could not load policy {bad}" in out.stderr and "daemon.placement" in out.stderr


def _has_memory_controller() -> bool:
    return "memory" in (CGROUP2 / "cgroup.controllers").read_text().split()


def _wait_for(predicate, timeout_seconds: float = 30.0):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"condition not met within {timeout_seconds} s")


HOG = "import time; b = bytearray(512 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(600)"


def test_oom_kill_is_reported_and_not_restarted(world):
    # Runs where the memory controller exists (the GPU box: pure cgroup v2); here it cannot.
    if not _has_memory_controller():
        pytest.skip(f"no memory controller in {CGROUP2}/cgroup.controllers (hybrid host); runs on the GPU box")
    policy = _policy(world)
    import yaml

    data = yaml.safe_load(policy.read_text())
    data["services"]["hog"] = {"engine": {"command": [sys.executable, "-c", HOG]}, "memory_max": "256M"}
    policy.write_text(yaml.safe_dump(data))
    sock = world["run"] / "sock" / "control.sock"
    _sparkd(world, policy)
    out = sparkctl(sock, "start", "hog")
    print(out.stdout, out.stderr)
    st = _wait_for(lambda: (s := service(status_json(sock), "hog"))["last_result"] == "oom-kill" and s)
    print("status after the OOM kill:", st)
    assert st["state"] in ("inactive", "failed") and st["memory_enforced"] is True
    time.sleep(3)  # Restart=no: nothing comes back
    st = service(status_json(sock), "hog")
    assert st["state"] in ("inactive", "failed") and st["last_result"] == "oom-kill"
    cg = world["cgroup_root"] / "sparkd.slice" / "sparkd-hog.service"
    assert not cg.exists() or not (cg / "cgroup.procs").read_text().split()
    human = sparkctl(sock, "status")
    print(human.stdout)
    assert "oom-kill" in human.stdout


CUDA_HOLDER = (
    "import sys, time, torch; x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); "
    "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(600)"
)


@pytest.mark.gpu
def test_gpu_guard_refuses_a_real_cuda_process(world):
    policy = _policy(world)
    sock = world["run"] / "sock" / "control.sock"
    holder = subprocess.Popen([sys.executable, "-c", CUDA_HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        _sparkd(world, policy)
        out = sparkctl(sock, "start", "sleeper")
        print(out.stdout, out.stderr)
        assert out.returncode == 1
        assert "guards.gpu_busy_mib" in out.stdout and f"pid {holder.pid}" in out.stdout
        assert not (world["cgroup_root"] / "sparkd.slice" / "sparkd-sleeper.service").exists()
    finally:
        holder.kill()
        holder.wait()
