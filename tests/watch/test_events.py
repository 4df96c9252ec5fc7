"""The event log: fsynced JSON lines, size-based rotation, sequence numbers that continue across a
restart, and nothing lost or repeated when read back."""

from __future__ import annotations

import asyncio
import json

from sparkd.watch.events import EventLog


def test_append_read_and_restart_continues_the_sequence(tmp_path):
    log = EventLog(tmp_path)
    log.open()
    for i in range(3):
        log.append(type="detected", service="llm", detector="psi", values={"i": i})
    log.close()
    again = EventLog(tmp_path)  # a restarted sparkd
    again.open()
    assert again.last_seq == 3
    again.append(type="fired", rule="stop")
    events = again.read()
    assert [e["seq"] for e in events] == [1, 2, 3, 4]
    assert events[0]["values"] == {"i": 0} and events[3]["rule"] == "stop"
    assert [e["seq"] for e in again.read(after_seq=2)] == [3, 4]
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert all(json.loads(line)["time"] > 0 for line in lines)


def test_rotation_keeps_the_newest_files_and_the_sequence(tmp_path):
    log = EventLog(tmp_path, max_bytes=400, keep=2)
    log.open()
    for i in range(40):
        log.append(type="detected", values={"i": i, "pad": "x" * 40})
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"]
    assert all(p.stat().st_size <= 400 for p in tmp_path.iterdir())
    seqs = [e["seq"] for e in EventLog(tmp_path, max_bytes=400, keep=2).read()]
    assert seqs == list(range(seqs[0], 41)), "events inside the kept files are contiguous, newest last"
    reopened = EventLog(tmp_path, max_bytes=400, keep=2)
    reopened.open()
    assert reopened.last_seq == 40


def test_a_line_torn_by_a_crash_is_skipped_not_fatal(tmp_path):
    (tmp_path / "events.jsonl").write_text('{"seq": 1, "time": 1, "type": "a"}\n{"seq": 2, "ti')
    log = EventLog(tmp_path)
    log.open()
    log.append(type="b")
    assert [e["seq"] for e in log.read()] == [1, 2]


def test_since_and_limit(tmp_path):
    clock = iter(range(100, 200)).__next__
    log = EventLog(tmp_path, clock=lambda: float(clock()))
    for _ in range(5):
        log.append(type="x")
    assert [e["time"] for e in log.read(since=102)] == [102, 103, 104]
    assert [e["seq"] for e in log.read(limit=2)] == [4, 5]


def test_wait_returns_when_a_newer_event_arrives(tmp_path):
    log = EventLog(tmp_path)
    log.open()

    async def scenario():
        waiter = asyncio.create_task(log.wait(0, 30))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        log.append(type="x")
        await asyncio.wait_for(waiter, 5)

    asyncio.run(scenario())
