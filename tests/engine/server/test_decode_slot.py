"""The decode slot is free by the time a request sees its generation end: a next request (here in an
event loop of its own, as starlette's TestClient runs each request without `with`) never waits on a
release still in flight from a loop that has gone (the hang CI met in session 18)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sparkd.engine.server.slot import DecodeSlot


async def _request(slot: DecodeSlot, n: int, fail: bool = False) -> tuple[list[int], bool]:
    """One request's events; and whether the slot was free when the end was seen."""
    def work(emit):
        for i in range(n):
            emit(i)
        if fail:
            raise RuntimeError("the engine broke")

    got = []
    async for event in slot.run(slot.admit(), work, threading.Event()):
        got.append(event)
    return got, not slot._lock.locked() and slot.running == 0


def test_the_slot_is_free_when_a_request_sees_its_end():
    slot = DecodeSlot(max_queue=4)
    try:
        for n in (0, 1, 5, 50):  # a new event loop each time, closed right after
            got, free = asyncio.run(asyncio.wait_for(_request(slot, n), 10))
            assert got == list(range(n)) and free
        assert slot.queued == 0
    finally:
        slot.close()


def test_a_failed_generation_frees_the_slot_before_its_error_is_raised():
    slot = DecodeSlot(max_queue=4)
    try:
        with pytest.raises(RuntimeError, match="the engine broke"):
            asyncio.run(asyncio.wait_for(_request(slot, 3, fail=True), 10))
        assert not slot._lock.locked() and slot.running == 0
        got, free = asyncio.run(asyncio.wait_for(_request(slot, 2), 10))  # the next request is served
        assert got == [0, 1] and free
    finally:
        slot.close()
