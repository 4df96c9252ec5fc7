"""sd_notify: tell systemd (Type=notify) that sparkd is ready, what it is doing, that it is alive
(WATCHDOG=1) and that it is stopping. Does nothing when NOTIFY_SOCKET was not set.

The socket address comes from the caller (the CLI reads the environment once); '@name' is an
abstract socket, anything else a filesystem path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from .logfmt import log_event

log = logging.getLogger("sparkd.notify")


class Notifier:
    def __init__(self, notify_socket: str | None, watchdog_usec: int | None = None, watchdog_pid: int | None = None):
        self._address = None
        if notify_socket:
            self._address = "\0" + notify_socket[1:] if notify_socket.startswith("@") else notify_socket
        # WATCHDOG_PID names the process systemd watches; another process must not send for it.
        mine = watchdog_pid is None or watchdog_pid == os.getpid()
        self.watchdog_usec = watchdog_usec if (watchdog_usec and mine and self._address) else None

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> "Notifier":
        def _int(key: str) -> int | None:
            try:
                return int(environ[key])
            except (KeyError, ValueError):
                return None

        return cls(environ.get("NOTIFY_SOCKET"), _int("WATCHDOG_USEC"), _int("WATCHDOG_PID"))

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, **fields: str) -> bool:
        """send(READY="1", STATUS="...") -> True when delivered. Failures are logged, never raised:
        a supervisor must not die because systemd stopped listening."""
        if self._address is None:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(payload, self._address)
        except OSError as exc:
            log_event(log, "notify_failed", logging.WARNING, socket=self._address.replace("\0", "@"), error=exc.strerror or exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(READY="1", STATUS=status)

    def status(self, status: str) -> bool:
        return self.send(STATUS=status)

    def stopping(self, status: str = "stopping") -> bool:
        return self.send(STOPPING="1", STATUS=status)

    async def watchdog_loop(self) -> None:
        """Ping at half of WATCHDOG_USEC (systemd's recommendation) until cancelled."""
        if not self.watchdog_usec:
            return
        interval_seconds = self.watchdog_usec / 2e6
        while True:
            self.send(WATCHDOG="1")
            await asyncio.sleep(interval_seconds)
