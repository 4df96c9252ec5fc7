"""PSI detector: memory.pressure of a service cgroup, or /proc/pressure/memory system-wide.

Each rule gets its own kernel trigger (one trigger per open file: write "some|full STALL_US
WINDOW_US", then POLLPRI when the stall within a window passes the threshold). Without
CAP_SYS_RESOURCE the kernel accepts only windows that are multiples of 2 s (EINVAL otherwise)
and may refuse system-wide triggers, so registration falls back: configured window, then the
next 2 s multiple with the stall scaled to keep its share, then polling. The file is read at
least every interval either way: the totals decide (and clear) conditions, a trigger only wakes
the detector early. POLLERR on a trigger means the cgroup is gone.
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..system.cgroups import parse_pressure
from .fdwait import PriWaiter

SYSTEM_PRESSURE_PATH = "/proc/pressure/memory"
# Unprivileged triggers must use windows that are multiples of this (kernel/sched/psi.c).
UNPRIVILEGED_WINDOW_US = 2_000_000


@dataclass(frozen=True)
class TriggerSpec:
    key: str  # the rule's name
    kind: str  # some | full
    stall_us: int
    window_us: int


@dataclass
class TriggerState:
    spec: TriggerSpec
    mode: str  # trigger | trigger-fallback | poll
    stall_us: int = 0  # what the kernel accepted
    window_us: int = 0
    reason: str = ""  # why not the configured trigger
    fd: int | None = None

    def describe(self) -> dict:
        return {"rule": self.spec.key, "mode": self.mode, "stall_us": self.stall_us, "window_us": self.window_us,
                "reason": self.reason}


@dataclass(frozen=True)
class PsiSample:
    time: float  # monotonic seconds
    path: str
    total_us: dict[str, int]  # some/full cumulative stall
    avg10: dict[str, float]
    fired: frozenset[str] = field(default=frozenset())  # rules whose trigger fired since the last sample


def _try_trigger(path: str, kind: str, stall_us: int, window_us: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.write(fd, f"{kind} {stall_us} {window_us}\0".encode())
    except OSError:
        os.close(fd)
        raise
    return fd


def register_trigger(path: str, spec: TriggerSpec) -> TriggerState:
    """The configured trigger, else a 2 s-multiple window, else polling; never raises."""
    try:
        fd = _try_trigger(path, spec.kind, spec.stall_us, spec.window_us)
        return TriggerState(spec, "trigger", spec.stall_us, spec.window_us, fd=fd)
    except OSError as exc:
        first = f"{spec.kind} {spec.stall_us} {spec.window_us} refused by {path}: {exc.strerror}"
        if exc.errno != errno.EINVAL:
            return TriggerState(spec, "poll", reason=first)
    window_us = max(1, math.ceil(spec.window_us / UNPRIVILEGED_WINDOW_US)) * UNPRIVILEGED_WINDOW_US
    stall_us = spec.stall_us * window_us // spec.window_us
    if window_us == spec.window_us:
        return TriggerState(spec, "poll", reason=first)
    try:
        fd = _try_trigger(path, spec.kind, stall_us, window_us)
    except OSError as exc:
        return TriggerState(spec, "poll", reason=f"{first}; {spec.kind} {stall_us} {window_us}: {exc.strerror}")
    reason = f"{first} (windows under 2 s need CAP_SYS_RESOURCE)"
    return TriggerState(spec, "trigger-fallback", stall_us, window_us, reason=reason, fd=fd)


class PressureGone(Exception):
    """The pressure file went away (its cgroup was removed)."""


class PsiDetector:
    name = "psi"

    def __init__(self, path: str, specs: list[TriggerSpec], on_sample: Callable[[PsiSample], None], *,
                 interval_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.path = str(path)
        self._specs = specs
        self._on_sample = on_sample
        self._interval_seconds = interval_seconds
        self._clock = clock
        self.triggers: list[TriggerState] = []

    def modes(self) -> list[dict]:
        return [t.describe() for t in self.triggers]

    def read(self, fired: frozenset[str] = frozenset()) -> PsiSample:
        try:
            with open(self.path) as f:
                parsed = parse_pressure(f.read())
        except (FileNotFoundError, ProcessLookupError, OSError) as exc:
            if isinstance(exc, FileNotFoundError) or exc.errno in (errno.ENODEV, errno.ENOENT):
                raise PressureGone(f"{self.path} is gone") from exc
            raise
        return PsiSample(self._clock(), self.path, {k: int(v.get("total", 0)) for k, v in parsed.items()},
                         {k: float(v.get("avg10", 0.0)) for k, v in parsed.items()}, fired)

    def _register(self, waiter: PriWaiter) -> dict[int, TriggerState]:
        self.triggers = [register_trigger(self.path, spec) for spec in self._specs]
        by_fd = {}
        for t in self.triggers:
            if t.fd is not None:
                waiter.register(t.fd)
                by_fd[t.fd] = t
        return by_fd

    async def run(self) -> None:
        """Emit a sample at every trigger and every interval until the file is gone (PressureGone)."""
        waiter = PriWaiter()
        by_fd: dict[int, TriggerState] = {}
        try:
            by_fd = await asyncio.to_thread(self._register, waiter)
            self._on_sample(self.read())
            while True:
                fired = await waiter.wait(self._interval_seconds)
                if any(mask & select.EPOLLERR for mask in fired.values()):
                    raise PressureGone(f"{self.path}: POLLERR on its trigger (cgroup removed)")
                self._on_sample(self.read(frozenset(by_fd[fd].spec.key for fd in fired if fd in by_fd)))
        finally:
            for fd in by_fd:
                waiter.unregister(fd)
                os.close(fd)
            waiter.close()
