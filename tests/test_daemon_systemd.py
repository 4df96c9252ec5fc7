"""End to end under a real systemd (booted in throwaway namespaces): sparkd picks the systemd
backend by itself, evicts a competitor, places a unit with the limits set, re-adopts it after
kill -9, reports a failing engine's result without restarting it, and stops it."""

from __future__ import annotations

import json
import signal
import time

import pytest
import yaml

from sparkd_harness import Sparkd, service, sparkctl, status_json

pytestmark = [pytest.mark.systemd, pytest.mark.root]
# When the failing engine outlives its start job, this bounds the wait for its exit report.
REPORT_TIMEOUT_SECONDS = 30.0


@pytest.fixture(scope="module")
def world(systemd_box):
    share = systemd_box.share_dir
    policy = {
        "daemon": {"placement": "auto", "state_dir": str(share / "state"), "control_socket": str(share / "run" / "control.sock")},
        "guards": {"reserve": "64M"},  # default competitors: ollama.service, stop_and_disable
        "services": {
            "sleeper": {"engine": {"command": ["/bin/sleep", "10000"]}, "memory_max": "256M", "stop_timeout": "5s"},
            "failing": {"engine": {"command": ["/bin/sh", "-c", "exit 3"]}, "memory_max": "128M"},
        },
    }
    path = share / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    prefix = ["nsenter", "-t", str(systemd_box.init_pid()), "-m", "-p", "-C", "--"]
    daemons: list[Sparkd] = []

    def start() -> Sparkd:
        d = Sparkd(path, share / "run" / "control.sock", share / "sparkd.log", prefix=prefix)
        daemons.append(d)
        return d.start()

    yield {"box": systemd_box, "sock": share / "run" / "control.sock", "start": start}
    for d in daemons:
        d.ensure_dead()


def _show(box, unit: str, *props: str) -> dict[str, str]:
    out = box.run(["systemctl", "show", unit, "-p", ",".join(props)])
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def test_systemd_flow(world):
    box, sock = world["box"], world["sock"]
    d = world["start"]()
    assert "backend=systemd" in d.log_text() and "PID 1 is systemd" in d.log_text()
    assert box.run(["systemd-run", "--unit=ollama.service", "/bin/sleep", "10000"]).returncode == 0

    out = sparkctl(sock, "start", "sleeper")
    assert out.returncode == 0, out.stdout + out.stderr
    assert _show(box, "ollama.service", "ActiveState")["ActiveState"] in ("inactive", "failed")
    assert "event=guard service=sleeper check=competitor[ollama.service]" in d.log_text()
    props = _show(box, "sparkd-sleeper.service", "MemoryMax", "MemorySwapMax", "OOMPolicy", "Slice", "MainPID")
    assert (props["MemoryMax"], props["MemorySwapMax"], props["OOMPolicy"], props["Slice"]) == (
        str(256 << 20), "0", "stop", "sparkd.slice")
    st = service(status_json(sock), "sleeper")
    assert (st["state"], st["backend"], st["main_pid"]) == ("active", "systemd", int(props["MainPID"]))

    d.kill9()
    d = world["start"]()
    assert "event=adopted service=sleeper backend=systemd" in d.log_text()
    assert sparkctl(sock, "start", "sleeper").stdout.strip().startswith("sleeper is already running")
    assert _show(box, "sparkd-sleeper.service", "MainPID")["MainPID"] == props["MainPID"]
    units = box.run(["systemctl", "list-units", "--plain", "--no-legend", "sparkd-*"]).stdout.split("\n")
    assert len([u for u in units if u.startswith("sparkd-sleeper.service")]) == 1

    # Depending on when it exits, systemd fails the start job or the unit fails just after it:
    # either way the result is reported, with the exit status.
    started = sparkctl(sock, "start", "failing")
    assert started.returncode == 0 or "exit status 3" in started.stdout, started.stdout
    deadline = time.monotonic() + REPORT_TIMEOUT_SECONDS
    while (failing := service(status_json(sock), "failing"))["last_result"] is None:
        assert time.monotonic() < deadline, failing
        time.sleep(0.1)
    if failing["last_result"] == "start-failed":
        assert "exit status 3" in failing["last_message"]
    else:
        assert (failing["last_result"], failing["last_exit_status"]) == ("exit-code", 3)
    assert failing["state"] in ("failed", "inactive")  # Restart=no: not running again

    out = sparkctl(sock, "stop", "sleeper")
    assert out.returncode == 0, out.stdout + out.stderr
    assert service(status_json(sock), "sleeper")["state"] == "inactive"
    assert d.signal(signal.SIGTERM) == 0
    assert "event=exited" in d.log_text()
    print(json.dumps(failing))
