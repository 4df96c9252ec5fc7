"""memory.events detector: increments of oom, oom_kill, max and high in a service cgroup.

The kernel notifies a change of memory.events like any kernfs file (POLLPRI), so the detector
sleeps on that and re-reads at least every interval as a backstop; where the file cannot be
polled (a plain file in tests) it polls. Works under both placements: in cgroupfs mode this is
the only OOM signal there is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..system.cgroups import parse_flat_keyed
from .fdwait import PriWaiter

COUNTERS = ("oom", "oom_kill", "max", "high")


class EventsUnavailable(Exception):
    """The cgroup has no memory.events (no memory controller) or is gone."""


@dataclass(frozen=True)
class CounterIncrement:
    time: float  # monotonic
    path: str
    counter: str
    before: int
    after: int


def read_counters(path: str) -> dict[str, int]:
    try:
        with open(path) as f:
            return parse_flat_keyed(f.read())
    except FileNotFoundError:
        raise EventsUnavailable(f"{path} does not exist (memory controller not enabled, or cgroup removed)") from None


def increments(before: dict[str, int], after: dict[str, int], path: str, now: float) -> list[CounterIncrement]:
    return [CounterIncrement(now, path, c, before.get(c, 0), after.get(c, 0))
            for c in COUNTERS if after.get(c, 0) > before.get(c, 0)]


class MemoryEventsDetector:
    name = "memory_events"

    def __init__(self, path: str, on_increment: Callable[[CounterIncrement], None], *,
                 on_sample: Callable[[float, dict[str, int]], None] | None = None,
                 interval_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.path = str(path)
        self._on_increment = on_increment
        # every read, increments or not: rate rules need the quiet samples to see a rate fall
        self._on_sample = on_sample or (lambda now, counters: None)
        self._interval_seconds = interval_seconds
        self._clock = clock
        self.mode = "starting"

    async def run(self) -> None:
        last = read_counters(self.path)  # counts before sparkd watched are history, not news
        self._on_sample(self._clock(), last)
        waiter = PriWaiter()
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                waiter.register(fd)
                self.mode = "notify"
            except OSError as exc:
                self.mode = f"poll ({exc.strerror})"
            while True:
                await waiter.wait(self._interval_seconds)
                os.pread(fd, 4096, 0)  # re-arms kernfs notification
                now = read_counters(self.path)
                when = self._clock()
                for inc in increments(last, now, self.path, when):
                    self._on_increment(inc)
                self._on_sample(when, now)
                last = now
        finally:
            waiter.unregister(fd)
            os.close(fd)
            waiter.close()
