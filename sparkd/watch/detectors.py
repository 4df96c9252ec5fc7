"""Detector tasks: each detector runs as one asyncio task; a detector that fails is reported (with
its error) and, if its subject still exists, started again after RETRY_SECONDS; the other
detectors and the daemon go on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

# A detector that fails at once would otherwise be restarted in a tight loop and flood the log.
RETRY_SECONDS = 30.0


@dataclass
class DetectorHandle:
    key: str  # e.g. "psi:llm", "kmsg"
    detector: Any
    task: asyncio.Task | None = None
    state: str = "starting"  # running | gone | failed | skipped | stopped
    error: str = ""
    failed_at: float | None = None
    extra: dict = field(default_factory=dict)

    def describe(self) -> dict:
        mode = getattr(self.detector, "mode", None)
        modes = self.detector.modes() if hasattr(self.detector, "modes") else None
        out = {"state": self.state, "error": self.error or None, "mode": mode}
        if modes is not None:
            out["triggers"] = modes
        return {k: v for k, v in out.items() if v is not None}


class DetectorSet:
    def __init__(self, on_ended: Callable[[DetectorHandle], None], clock: Callable[[], float] = time.monotonic):
        self.handles: dict[str, DetectorHandle] = {}
        self._on_ended = on_ended
        self._clock = clock

    def start(self, key: str, detector: Any, run: Callable[[], Coroutine]) -> DetectorHandle:
        handle = DetectorHandle(key, detector, state="running")
        handle.task = asyncio.get_running_loop().create_task(run(), name=f"sparkd-watch-{key}")
        handle.task.add_done_callback(lambda task, h=handle: self._ended(h, task))
        self.handles[key] = handle
        return handle

    def skip(self, key: str, detector: Any, reason: str) -> None:
        self.handles[key] = DetectorHandle(key, detector, state="skipped", error=reason)

    def _ended(self, handle: DetectorHandle, task: asyncio.Task) -> None:
        if task.cancelled():
            handle.state = "stopped"
            return
        exc = task.exception()
        handle.state = "failed" if exc is not None else "ended"
        handle.error = f"{type(exc).__name__}: {exc}" if exc is not None else ""
        handle.failed_at = self._clock()
        handle.extra["exception"] = exc
        self._on_ended(handle)

    def due_for_retry(self, key: str) -> bool:
        handle = self.handles.get(key)
        if handle is None:
            return True
        if handle.state != "failed":
            return False
        return self._clock() - (handle.failed_at or 0) >= RETRY_SECONDS

    async def stop(self, key: str) -> None:
        handle = self.handles.pop(key, None)
        if handle is not None and handle.task is not None and not handle.task.done():
            handle.task.cancel()
            await asyncio.gather(handle.task, return_exceptions=True)

    async def stop_all(self) -> None:
        for key in list(self.handles):
            await self.stop(key)

    def health(self) -> dict:
        return {key: h.describe() for key, h in sorted(self.handles.items())}
