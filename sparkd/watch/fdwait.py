"""Wait in asyncio for POLLPRI on kernel files (PSI triggers, cgroup memory.events).

asyncio's add_reader waits for POLLIN only; PSI triggers and kernfs notifications signal POLLPRI.
An epoll instance registered for EPOLLPRI becomes readable itself when one of its files fires, so
the epoll fd goes to add_reader and the callback collects which files fired and how.
"""

from __future__ import annotations

import asyncio
import select


class PriWaiter:
    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._fired: dict[int, int] = {}
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._epoll.fileno(), self._collect)

    def register(self, fd: int) -> None:
        """Raises OSError (EPERM for regular files) when the file cannot be polled."""
        # Edge-triggered: kernfs keeps a changed file ready until it is read, which the detector
        # does a moment later; level-triggered would spin the loop until then.
        self._epoll.register(fd, select.EPOLLPRI | select.EPOLLERR | select.EPOLLET)

    def unregister(self, fd: int) -> None:
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass

    def _collect(self) -> None:
        for fd, mask in self._epoll.poll(0):
            self._fired[fd] = self._fired.get(fd, 0) | mask
        if self._fired:
            self._event.set()

    async def wait(self, timeout_seconds: float) -> dict[int, int]:
        """{fd: epoll mask} of the files that fired, empty after timeout_seconds."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout_seconds)
        except TimeoutError:
            pass
        fired, self._fired = self._fired, {}
        self._event.clear()
        return fired

    def close(self) -> None:
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
