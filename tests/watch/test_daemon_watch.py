"""End to end: a real sparkd (cgroupfs placement on the real cgroup2 tree) with watcher rules; a
real NVRM line written into /dev/kmsg is recorded and acted on (the service stopped, starts
refused until `sparkctl clear`); events survive a restart and lines logged while sparkd was down
are still seen; watcher health (PSI trigger modes) is in the status."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sparkd_harness import Sparkd, free_port, pid_alive, service, sparkctl, status_json
from test_daemon_cgroupfs import world  # noqa: F401  (fixture: test cgroup root, run dir, cleanup)
from test_kmsg import write_kmsg

pytestmark = pytest.mark.root
# Only a guard against a hang: the measured latency is printed, and asserted nowhere.
WAIT_SECONDS = 30.0


def _policy(world) -> object:
    policy = {
        "daemon": {"placement": "cgroupfs", "cgroup_root": str(world["cgroup_root"]), "metrics_listen": f"127.0.0.1:{world['metrics_port']}",
                   "state_dir": str(world["tmp"] / "state"), "control_socket": str(world["run"] / "sock" / "control.sock")},
        "guards": {"reserve": "64M", "competitors": []},
        "services": {"sleeper": {"engine": {"command": ["sleep", "10000"]}, "memory_max": "256M", "stop_timeout": "5s"}},
        "pressure": {"rules": [{"name": "warn", "detector": "psi", "kind": "some", "stall": "150ms", "window": "1s",
                                "action": "warn"}]},
        "kernel_log": {"nvml_xid": True, "rules": [
            {"name": "nvrm-oom", "match": "no_memory", "action": ["stop", "refuse_starts"]},
            {"name": "node-xid", "match": "xid_node", "action": "warn", "dry_run": True},
        ]},
    }
    path = world["tmp"] / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def _events(socket) -> list[dict]:
    out = sparkctl(socket, "events", "--json")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def _wait_for(socket, predicate) -> list[dict]:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        events = _events(socket)
        if predicate(events):
            return events
        time.sleep(0.05)
    raise AssertionError(f"events never matched: {json.dumps(_events(socket), indent=1)}")




def _samples(port: int) -> dict[tuple, float]:
    """sparkd's /metrics as {(name, sorted labels): value}."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_nvrm_line_stops_the_service_and_holds_starts_until_clear(world):  # noqa: F811
    world["metrics_port"] = free_port()
    socket = world["run"] / "sock" / "control.sock"
    d = Sparkd(_policy(world), socket, world["tmp"] / "sparkd.log")
    world["daemons"].append(d)
    d.start()
    assert sparkctl(socket, "start", "sleeper").returncode == 0
    pid = service(status_json(socket), "sleeper")["main_pid"]

    # watcher health: the PSI detector follows the started service and says its trigger mode
    deadline = time.monotonic() + WAIT_SECONDS
    while "psi:sleeper" not in (status_json(socket)["watchers"] or {}).get("detectors", {}):
        assert time.monotonic() < deadline, status_json(socket)["watchers"]
        time.sleep(0.05)
    detectors = status_json(socket)["watchers"]["detectors"]
    assert detectors["psi:sleeper"]["triggers"][0]["mode"] in ("trigger", "trigger-fallback")
    assert detectors["kmsg"]["state"] == "running"
    assert detectors["nvml_xid"]["state"] in ("unavailable", "running")  # no GPU here: unavailable, with why

    marker = uuid.uuid4().hex
    written_at = time.time()
    write_kmsg(f"NVRM: nvAssertOkFailedNoLog: Out of memory [NV_ERR_NO_MEMORY] kgrctxAllocMainCtxBuffer {marker}")
    events = _wait_for(socket, lambda ev: any(e["type"] == "action" and e["action"] == "refuse_starts" for e in ev))
    detected = next(e for e in events if e["type"] == "detected" and marker in e["values"].get("text", ""))
    stop = next(e for e in events if e["type"] == "action" and e["action"] == "stop")
    print(f"\nkmsg write -> detected event: {detected['time'] - written_at:.3f} s; "
          f"-> stop done: {stop['time'] - written_at:.3f} s")
    assert detected["values"]["kind"] == "no_memory" and detected["detector"] == "kmsg"
    assert stop["service"] == "sleeper" and "stopped" in stop["result"]
    assert not pid_alive(pid)

    refused = sparkctl(socket, "start", "sleeper")
    assert refused.returncode == 1 and "refused since watcher rule 'nvrm-oom'" in refused.stdout + refused.stderr
    cleared = sparkctl(socket, "clear")
    assert cleared.returncode == 0 and "sleeper" in cleared.stdout
    assert sparkctl(socket, "start", "sleeper").returncode == 0

    # a node-fault Xid under a dry-run rule: recorded, "would have", nothing done
    write_kmsg(f"NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, GPU has fallen off the bus {marker}")
    events = _wait_for(socket, lambda ev: any(e.get("rule") == "node-xid" and e["type"] == "action" for e in ev))
    assert next(e for e in events if e.get("rule") == "node-xid" and e["type"] == "action")["result"].startswith("would have")
    assert service(status_json(socket), "sleeper")["state"] == "active"

    # the same decisions as Prometheus counters (the real kernel log may hold other NVRM lines: >=)
    samples = _samples(world["metrics_port"])
    assert samples[("sparkd_nvrm_events_total", (("bucket", "out_of_memory"), ("xid", "none")))] >= 1
    assert samples[("sparkd_nvrm_events_total", (("bucket", "node"), ("xid", "79")))] >= 1
    assert samples[("sparkd_actions_total", (("action", "stop"), ("outcome", "done"), ("rule", "nvrm-oom")))] == 1
    assert samples[("sparkd_actions_total", (("action", "warn"), ("outcome", "dry_run"), ("rule", "node-xid")))] == 1
    kmsg_up = [v for (name, labels), v in samples.items() if name == "sparkd_watcher_up" and ("watcher", "kmsg") in labels]
    assert kmsg_up == [1.0]

    # restart: a line logged while sparkd is down is still seen, and sequence numbers go on
    last_seq = events[-1]["seq"]
    d.signal(15)
    write_kmsg(f"NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=x, while away {marker}")
    d.start()
    events = _wait_for(socket, lambda ev: any("while away" in e.get("values", {}).get("text", "") for e in ev))
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] == 1 and max(seqs) > last_seq
    human = sparkctl(socket, "events")
    assert "nvrm-oom" in human.stdout and "action=stop" in human.stdout
