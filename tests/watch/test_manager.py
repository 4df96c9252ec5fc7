"""Rules through the WatchManager with samples injected where the kernel cannot produce them on
demand (PSI stall levels, memory.events increments, MemAvailable), the actions' real effects on a
recording service control, and shrink_cache against a real HTTP server standing in for the
engine's /admin/cache."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkd.policy import parse_policy
from sparkd.watch.events import EventLog
from sparkd.watch.holds import Holds
from sparkd.watch.manager import WatchManager
from sparkd.watch.memory_events import CounterIncrement, MemoryEventsDetector, read_counters
from sparkd.watch.mem_available import AvailableSample
from sparkd.watch.nvrm import classify
from sparkd.watch.psi import PsiSample

GIB = 1 << 30


class CacheEngine:
    """A tiny real HTTP server with the engine's /admin/cache contract: GET -> {"budget": N},
    POST {"budget": N} -> sets it and answers the budget before as previous_bytes."""

    def __init__(self, budget: int):
        self.budget = budget
        self.posts: list[int] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer(200, {"budget": engine.budget}) if self.path == "/admin/cache" else self._answer(404, {})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                previous, engine.budget = engine.budget, body["budget"]
                engine.posts.append(body["budget"])
                self._answer(200, {"budget": engine.budget, "previous_bytes": previous})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.listen = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class RecordingControl:
    def __init__(self, listen: str | None = None):
        self.listen = listen
        self.stopped: list[str] = []
        self.held: list[tuple] = []
        self.running = {"llm": None}

    def running_services(self):
        return self.running

    def service_of_pid(self, pid):
        return "llm" if pid == 4242 else None

    async def stop_service(self, name):
        self.stopped.append(name)
        return f"{name} stopped (result success)"

    def hold_starts(self, name, rule, reason):
        self.held.append((name, rule))

    def engine_listen(self, name):
        return self.listen

    def engine_api_key(self, name):
        return None

    async def evict_competitors(self):
        return []


POLICY = {
    "guards": {"reserve": "4G", "competitors": []},
    "pressure": {"rules": [
        {"name": "warn", "detector": "psi", "kind": "some", "stall": "150ms", "window": "1s", "action": "warn"},
        {"name": "shrink", "detector": "psi", "kind": "full", "stall": "100ms", "window": "1s", "duration": "5s",
         "clear_for": "3s", "action": "shrink_cache", "budget": "1G", "cooldown": "60s"},
        {"name": "stop", "detector": "psi", "kind": "full", "stall": "500ms", "window": "1s", "duration": "10s",
         "action": ["stop", "refuse_starts"], "dry_run": True},
        {"name": "oom", "detector": "memory_events", "counter": "oom_kill", "action": "warn", "cooldown": "10s"},
        {"name": "floor", "detector": "mem_available", "duration": "2s", "action": "warn"},
    ]},
    "kernel_log": {"rules": [
        {"name": "nvrm-oom", "match": "no_memory", "action": ["stop", "refuse_starts"]},
        {"name": "app-xid", "match": "xid_application", "action": "warn"},
    ]},
}


def make(tmp_path, control, policy=POLICY):
    p = parse_policy(policy, source="test", total_memory_bytes=64 * GIB)
    return WatchManager(p, control, EventLog(tmp_path), Holds(tmp_path), state_dir=tmp_path)


def feed_psi(manager, service, series):
    """series: (time, some_total_us, full_total_us)."""
    for t, some, full in series:
        manager._on_psi(service, PsiSample(t, "/x/memory.pressure", {"some": some, "full": full}, {"some": 0.0, "full": 0.0}))


async def settle(manager):
    while manager._tasks:
        await asyncio.gather(*list(manager._tasks))


def kinds(manager, *types):
    return [(e["type"], e.get("rule"), e.get("action"), e.get("result")) for e in manager.events.read()
            if e["type"] in types]


def test_duration_hysteresis_grow_back_and_dry_run(tmp_path):
    engine = CacheEngine(budget=8 * GIB)
    control = RecordingControl(engine.listen)
    manager = make(tmp_path, control)

    async def scenario():
        manager.events.open()
        # full stall 600 ms per second for t=0..12 (some = full), then no stall for 6 s
        series = [(float(t), 600_000 * t, 600_000 * t) for t in range(0, 13)]
        series += [(float(t), 600_000 * 12, 600_000 * 12) for t in range(13, 19)]
        feed_psi(manager, "llm", series)
        await settle(manager)

    try:
        asyncio.run(scenario())
    finally:
        engine.close()
    fired = [(e["rule"], e["time"]) for e in manager.events.read() if e["type"] == "fired"]
    assert [r for r, _ in fired] == ["warn", "shrink", "stop"]
    actions = {(e["rule"], e["action"]): e["result"] for e in manager.events.read() if e["type"] == "action"}
    assert actions[("shrink", "shrink_cache")] == "expert cache shrunk to 1.0G (was 8.0G)"
    assert actions[("stop", "stop")] == "would have stopped llm"
    assert actions[("stop", "refuse_starts")] == "would have refused starts of llm until `sparkctl clear`"
    assert control.stopped == [] and control.held == [], "dry run did something"
    # pressure cleared: shrink grew the cache back to what the engine had
    assert engine.posts == [1 * GIB, 8 * GIB] and engine.budget == 8 * GIB
    cleared = [e["rule"] for e in manager.events.read() if e["type"] == "cleared"]
    assert set(cleared) == {"warn", "shrink", "stop"}
    # the crossing of each threshold is an event before its decision
    crossed = [e["rule"] for e in manager.events.read() if e["type"] == "crossed"]
    assert crossed[:3] == ["warn", "shrink", "stop"]


def test_duration_is_not_reached_when_pressure_breaks_off(tmp_path):
    manager = make(tmp_path, RecordingControl())

    async def scenario():
        manager.events.open()
        total, series = 0, []
        for t in range(0, 20):
            total += 0 if t % 4 == 0 else 600_000  # every 4th second without stall: never 5 s in a row
            series.append((float(t), total, total))
        feed_psi(manager, "llm", series)
        await settle(manager)

    asyncio.run(scenario())
    fired = [e["rule"] for e in manager.events.read() if e["type"] == "fired"]
    assert "shrink" not in fired and "stop" not in fired


def test_cooldown_on_counter_increments(tmp_path):
    manager = make(tmp_path, RecordingControl())

    async def scenario():
        manager.events.open()
        for t, n in [(0.0, 1), (3.0, 2), (4.0, 3), (11.0, 4)]:
            manager._on_increment("llm", CounterIncrement(t, "/x/memory.events", "oom_kill", n - 1, n))
        for t in range(100):  # what memory.events `max` does under pressure: no rule, no event
            manager._on_increment("llm", CounterIncrement(12.0 + t / 100, "/x/memory.events", "high", t, t + 1))
        await settle(manager)

    asyncio.run(scenario())
    # the second increment within the cooldown is noted once, the third is quiet
    assert [t for t, *_ in kinds(manager, "fired", "cooldown")] == ["fired", "cooldown", "fired"]
    assert len([e for e in manager.events.read() if e["type"] == "detected"]) == 4


def test_available_floor_defaults_to_guards_reserve(tmp_path):
    manager = make(tmp_path, RecordingControl())

    async def scenario():
        manager.events.open()
        for t, avail in [(0, 5), (1, 3), (2, 3), (3, 3), (4, 4.2), (5, 4.5), (6, 4.5)]:
            manager._on_available(AvailableSample(float(t), int(avail * GIB), 64 * GIB))
        await settle(manager)

    asyncio.run(scenario())
    got = [(e["type"], e["time"] if False else e.get("values", {}).get("available_bytes")) for e in manager.events.read()
           if e["type"] in ("fired", "cleared")]
    # below 4G from t=1, fires after 2 s (t=3); 4.2G is above the floor but not 10 % above: still active
    assert got == [("fired", 3 * GIB), ("cleared", int(4.5 * GIB))]


def test_kernel_log_findings_act_on_the_owner_or_every_service(tmp_path):
    control = RecordingControl()
    manager = make(tmp_path, control)

    async def scenario():
        manager.events.open()
        manager.holds.load()
        manager._on_finding(classify("NVRM: Xid (PCI:0000:01:00): 13, pid=4242, name=sparkd-engine, Graphics Exception"), "kmsg")
        manager._on_finding(classify("NVRM: Out of memory [NV_ERR_NO_MEMORY] kgrctxAllocMainCtxBuffer"), "kmsg")
        await settle(manager)

    asyncio.run(scenario())
    detected = [e for e in manager.events.read() if e["type"] == "detected"]
    assert detected[0]["service"] == "llm" and detected[0]["values"]["xid"] == 13
    assert control.stopped == ["llm"] and control.held == [("llm", "nvrm-oom")]
    assert [e["rule"] for e in manager.events.read() if e["type"] == "fired"] == ["app-xid", "nvrm-oom"]


def test_shrink_cache_failure_is_an_event_not_a_crash(tmp_path):
    control = RecordingControl("127.0.0.1:9")  # nothing listens on the discard port
    policy = {"pressure": {"rules": [{"name": "s", "stall": "100ms", "action": "shrink_cache", "budget": "1G"}]}}
    manager = make(tmp_path, control, policy)

    async def scenario():
        manager.events.open()
        feed_psi(manager, "llm", [(0.0, 0, 0), (1.0, 500_000, 0)])
        await settle(manager)

    asyncio.run(scenario())
    (result,) = [e["result"] for e in manager.events.read() if e["type"] == "action"]
    assert result.startswith("failed: could not POST http://127.0.0.1:9/admin/cache")


@pytest.mark.parametrize("rule, message", [
    ({"name": "x", "detector": "psi", "action": "warn"}, "detector psi needs 'stall'"),
    ({"name": "x", "detector": "psi", "stall": "150ms", "window": "20s", "action": "warn"}, "'window' must be between 500ms and 10s"),
    ({"name": "x", "detector": "memory_events", "action": "warn"}, "needs 'counter'"),
    ({"name": "x", "stall": "150ms", "action": "reboot"}, "pressure.rules.0.action.0"),
    ({"name": "x", "stall": "150ms", "action": "shrink_cache"}, "needs 'budget'"),
    ({"name": "x", "stall": "150ms", "action": "warn", "for": "5s"}, "unknown key"),
    ({"name": "x", "stall": "150ms", "rate": 50, "action": "warn"}, "'rate' only goes with detector memory_events, found detector psi"),
    ({"name": "x", "detector": "memory_events", "counter": "high", "rate": 0, "action": "warn"}, "greater than 0"),
    ({"name": "x", "detector": "memory_events", "counter": "high", "rate": 50, "window": "2min", "action": "warn"},
     "'window' of a rate rule must be between 500ms and 60s, found 120 s"),
    ({"name": "x", "detector": "memory_events", "counter": "high", "rate": 50, "clear_below": 10, "action": "warn"},
     "'clear_below' is a PSI stall; a rate rule clears below half its 'rate'"),
])
def test_bad_rules_are_named(rule, message):
    from sparkd.errors import PolicyError

    with pytest.raises(PolicyError, match="could not load policy test") as err:
        parse_policy({"pressure": {"rules": [rule]}}, source="test", total_memory_bytes=GIB)
    assert message in str(err.value)


def test_shipped_dgx_spark_policy_is_valid_and_has_the_issue_defaults():
    from pathlib import Path

    from sparkd.policy import load_policy

    p = load_policy(Path(__file__).resolve().parents[2] / "policies" / "dgx-spark.yaml", total_memory_bytes=128 * GIB)
    rules = {r.name: r for r in p.pressure.rules}
    warn, shrink, stop = rules["warn-some-pressure"], rules["shrink-on-full-pressure"], rules["stop-on-sustained-full-pressure"]
    assert (warn.kind, warn.stall, warn.window, warn.action) == ("some", 0.15, 1.0, ["warn"])
    assert (shrink.kind, shrink.stall, shrink.window, shrink.duration, shrink.action) == ("full", 0.1, 1.0, 5.0, ["shrink_cache"])
    assert (stop.kind, stop.stall, stop.duration) == ("full", 0.5, 10.0) and "stop" in stop.action
    early = rules["shrink-on-throttling"]
    assert (early.detector, early.counter, early.rate, early.window, early.duration) == ("memory_events", "high", 50, 2, 2)
    assert early.action == ["shrink_cache"] and early.budget == shrink.budget
    kl = {r.match: r.action for r in p.kernel_log.rules}
    assert "stop" in kl["no_memory"] and "stop" in kl["xid_node"]
    assert all(r.cooldown > 0 for r in [*p.pressure.rules, *p.kernel_log.rules])


def test_shrink_cache_timeout_is_named(tmp_path):
    """What the GPU box showed: an engine stalled in its own throttled cgroup does not answer; the
    event must say it timed out (httpx's timeout text is empty)."""
    import socket

    from sparkd.watch.actions.shrink_cache import CacheClient

    with socket.socket() as silent:  # accepts connections (kernel backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        client = CacheClient(f"127.0.0.1:{silent.getsockname()[1]}", timeout_seconds=0.3)
        with pytest.raises(RuntimeError) as err:
            asyncio.run(client.set_budget(1 << 20))
    assert str(err.value) == f"could not POST {client.url}: ReadTimeout"


THROTTLE_POLICY = {"pressure": {"rules": [
    {"name": "throttle", "detector": "memory_events", "counter": "high", "rate": 50, "window": "2s", "duration": "2s",
     "clear_for": "3s", "action": "shrink_cache", "budget": "2G"},
    {"name": "full", "detector": "psi", "kind": "full", "stall": "100ms", "window": "1s", "duration": "5s",
     "clear_for": "3s", "action": "shrink_cache", "budget": "1G"},
]}}


def test_throttling_rate_shrinks_first_and_the_last_rule_to_clear_grows_back(tmp_path):
    """memory.events `high` (a file written as the kernel writes it) rises 100/s from t=0 to 10;
    full stall 600 ms/s from t=3 to 12. The rate rule shrinks at t=3, long before the stall rule
    (t=9); the cache is grown back, to the budget before the first shrink, only when both cleared."""
    engine = CacheEngine(budget=8 * GIB)
    manager = make(tmp_path, RecordingControl(engine.listen), THROTTLE_POLICY)
    events_file = tmp_path / "memory.events"

    async def scenario():
        manager.events.open()
        for t in range(20):
            high = 100 * min(t, 10)
            events_file.write_text(f"low 0\nhigh {high}\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
            manager._on_events_sample("llm", float(t), read_counters(str(events_file)))
            full = 600_000 * max(0, min(t, 12) - 3)
            feed_psi(manager, "llm", [(float(t), full, full)])
        await settle(manager)

    try:
        asyncio.run(scenario())
    finally:
        engine.close()
    rates = [(e["type"], e["values"]["per_second"]) for e in manager.events.read()
             if e["type"] in ("fired", "cleared") and e["rule"] == "throttle"]
    assert rates == [("fired", 100.0), ("cleared", 0.0)]
    order = [(e["type"], e["rule"]) for e in manager.events.read() if e["type"] in ("fired", "cleared")]
    assert order == [("fired", "throttle"), ("fired", "full"), ("cleared", "throttle"), ("cleared", "full")]
    results = [(e["rule"], e["result"]) for e in manager.events.read() if e["type"] in ("action", "reverted")]
    assert results == [("throttle", "expert cache shrunk to 2.0G (was 8.0G)"),
                       ("full", "expert cache shrunk to 1.0G (was 2.0G)"),
                       ("throttle", "not grown back yet: still shrunk for rule(s) full"),
                       ("full", "expert cache grown back to 8.0G")]
    assert engine.posts == [2 * GIB, 1 * GIB, 8 * GIB]


def test_memory_events_detector_reports_quiet_samples_too(tmp_path):
    """A rate must be able to fall: the detector hands every read to on_sample, increments or not
    (a plain file cannot be polled, so it reads every interval)."""
    path = tmp_path / "memory.events"
    path.write_text("low 0\nhigh 5\nmax 0\noom 0\noom_kill 0\n")
    samples, incs = [], []

    async def scenario():
        det = MemoryEventsDetector(str(path), incs.append, on_sample=lambda t, c: samples.append(c["high"]),
                                   interval_seconds=0.01)
        task = asyncio.create_task(det.run())
        while samples.count(5) < 3:
            await asyncio.sleep(0.01)
        path.write_text("low 0\nhigh 9\nmax 0\noom 0\noom_kill 0\n")
        while samples.count(9) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return det.mode

    mode = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert mode.startswith("poll")
    assert samples[0] == 5 and samples[-1] == 9 and set(samples) == {5, 9}
    assert [(i.counter, i.before, i.after) for i in incs] == [("high", 5, 9)]
