"""Pure rule logic over samples (no I/O, time passed in): how long a condition has held, when it
has cleared (hysteresis), and the cooldown after an action. Tested with literal samples.
"""

from __future__ import annotations

from collections import deque

FIRE, CLEAR, COOLDOWN = "fire", "clear", "cooldown"


class LevelCondition:
    """A condition with a duration, hysteresis and a cooldown.

    update() returns FIRE once the condition has been exceeded for `duration_seconds` without a
    break; the rule is then active until it has been `cleared` (a lower level than exceeded) for
    `clear_for_seconds`, when it returns CLEAR. After a FIRE no new FIRE comes for
    `cooldown_seconds`; an episode that would fire inside the cooldown returns COOLDOWN once.
    """

    def __init__(self, duration_seconds: float, clear_for_seconds: float, cooldown_seconds: float):
        self.duration_seconds = duration_seconds
        self.clear_for_seconds = clear_for_seconds
        self.cooldown_seconds = cooldown_seconds
        self.active = False
        self.exceeded_since: float | None = None
        self._clear_since: float | None = None
        self._last_fire: float | None = None
        self._cooldown_reported = False

    def update(self, now: float, exceeded: bool, cleared: bool) -> str | None:
        if self.active:
            return self._update_active(now, cleared)
        if not exceeded:
            self.exceeded_since = None
            self._cooldown_reported = False
            return None
        if self.exceeded_since is None:
            self.exceeded_since = now
        if now - self.exceeded_since < self.duration_seconds:
            return None
        if self._last_fire is not None and now - self._last_fire < self.cooldown_seconds:
            if self._cooldown_reported:
                return None
            self._cooldown_reported = True
            return COOLDOWN
        self.active, self._last_fire, self._clear_since = True, now, None
        return FIRE

    def _update_active(self, now: float, cleared: bool) -> str | None:
        if not cleared:
            self._clear_since = None
            return None
        if self._clear_since is None:
            self._clear_since = now
        if now - self._clear_since < self.clear_for_seconds:
            return None
        self.active, self.exceeded_since, self._clear_since = False, None, None
        self._cooldown_reported = False
        return CLEAR


class Cooldown:
    """For one-off occurrences (a kernel log line, a counter increment): act at most once per
    cooldown_seconds; later occurrences within it are recorded but not acted on."""

    def __init__(self, cooldown_seconds: float):
        self.cooldown_seconds = cooldown_seconds
        self._last: float | None = None
        self._refused_since_last = False

    def allow(self, now: float) -> bool:
        if self._last is not None and now - self._last < self.cooldown_seconds:
            return False
        self._last = now
        self._refused_since_last = False
        return True

    def first_refusal(self) -> bool:
        """True once per cooldown: what to record when allow() said no. Under memory pressure
        memory.events `max` rises hundreds of times a second; one notice per cooldown is enough."""
        first = not self._refused_since_last
        self._refused_since_last = True
        return first


class CounterRate:
    """Per-second rate of a cumulative counter (memory.events `high`) over the last `window_seconds`.

    The rate between the newest sample and the newest one at least a window older (or the oldest
    kept, when history is shorter); None until two samples exist; a counter that went backwards
    (a new cgroup) gives 0, never a negative rate.
    """

    def __init__(self, window_seconds: float):
        self.window_seconds = window_seconds
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, total: int) -> float | None:
        self._samples.append((now, total))
        # Keep one sample older than the window as the rate's start.
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window_seconds:
            self._samples.popleft()
        start_time, start_total = self._samples[0]
        if now <= start_time:
            return None
        return max((total - start_total) / (now - start_time), 0.0)


class StallWindow(CounterRate):
    """Stall time within the last `window_seconds`, from PSI's cumulative `total` (microseconds)."""

    def add(self, now: float, total_us: int) -> float | None:
        rate_us = super().add(now, total_us)
        return None if rate_us is None else rate_us / 1e6 * self.window_seconds
