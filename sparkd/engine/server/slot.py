"""One decode slot and a bounded FIFO queue in front of it.

Generation runs in one worker thread so the event loop keeps answering /health, /metrics and
new requests. The slot is released when the worker thread finishes, not when the HTTP side
gives up, so a cancelled request can never overlap the next one's generation.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable

from sparkd.engine.server.protocol import ApiError

Emit = Callable[[Any], None]
Work = Callable[[Emit], None]
_END = object()
# Retry-After is the mean of this many recent request durations times the queue ahead.
_RECENT_REQUESTS = 8


class Ticket:
    """A reserved place in the queue; entered once its request reached run()."""

    def __init__(self) -> None:
        self.entered = False


class DecodeSlot:
    def __init__(self, max_queue: int, on_change: Callable[[int, int], None] = lambda running, queued: None):
        self.max_queue = max_queue
        self._lock = asyncio.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkd-decode")
        self._durations: deque[float] = deque(maxlen=_RECENT_REQUESTS)
        self._on_change = on_change
        self.queued = 0
        self.running = 0

    def _changed(self) -> None:
        self._on_change(self.running, self.queued)

    def admit(self) -> "Ticket":
        """Reserve a place in the queue now (synchronously, so concurrent requests count), or
        refuse with 429 and a Retry-After estimate."""
        if self._lock.locked() and self.queued >= self.max_queue:
            raise ApiError(429, f"could not queue the request: the decode slot is busy and the queue is full "
                           f"({self.queued} waiting, --max-queue {self.max_queue}); retry later",
                           type_="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(self.retry_after_seconds())})
        self.queued += 1
        self._changed()
        return Ticket()

    def abandon(self, ticket: "Ticket") -> None:
        """Give back a place whose request never reached run() (a stream whose client left
        before the response started)."""
        if not ticket.entered:
            ticket.entered = True
            self.queued -= 1
            self._changed()

    def retry_after_seconds(self) -> int:
        mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
        return max(1, math.ceil(mean * (self.queued + 1)))

    async def run(self, ticket: "Ticket", work: Work, cancel: threading.Event) -> AsyncIterator[Any]:
        """Wait for the slot (after admit()), run work(emit) in the worker thread and yield what it
        emits. Leaving early (client gone) sets cancel; the slot frees when the thread ends, in the
        same loop callback that hands the request its end: a request that saw its end finds the slot
        free (a release left to the executor future's callbacks could still be in flight then, and
        never run where the loop closes with the response: starlette's TestClient without `with`)."""
        ticket.entered = True
        try:
            await self._lock.acquire()
        finally:
            self.queued -= 1
            self._changed()
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        started = time.monotonic()

        def emit(event: Any) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        def end(error: BaseException | None) -> None:
            self._release(started)
            if error is not None:
                events.put_nowait(error)
            events.put_nowait(_END)

        def call() -> None:
            error = None
            try:
                work(emit)
            except BaseException as exc:  # handed to the request; the worker thread lives on
                error = exc
            finally:
                loop.call_soon_threadsafe(end, error)
        try:
            self.running = 1
            self._changed()
            loop.run_in_executor(self._executor, call)
        except BaseException:
            self._release(started)
            raise
        try:
            while (event := await events.get()) is not _END:
                if isinstance(event, BaseException):
                    raise event
                yield event
        finally:
            cancel.set()  # harmless when the work already ended

    def _release(self, started: float) -> None:
        self._durations.append(time.monotonic() - started)
        self.running = 0
        self._lock.release()
        self._changed()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
