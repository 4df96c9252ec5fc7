"""The watchers' event log: every detection and decision is one JSON line in state_dir.

A line is appended and fsynced before the action it announces runs, so a crash or restart loses
nothing that was decided. Each event carries a sequence number that continues across restarts
(read back from the newest line at open) so `sparkctl events --follow` can resume after one.
Rotation is by size: events.jsonl -> events.jsonl.1 -> ... -> events.jsonl.<keep>, oldest dropped.
Each event is also logged (event=watch ...) for the journal.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import SparkdError
from ..logfmt import log_event

EVENTS_FILE = "events.jsonl"
log = logging.getLogger("sparkd.watch")
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class EventLogError(SparkdError):
    """The event log cannot be written or read."""


class EventLog:
    def __init__(self, state_dir: Path, *, max_bytes: int = 8 << 20, keep: int = 4,
                 clock: Callable[[], float] = time.time):
        self.path = Path(state_dir) / EVENTS_FILE
        self.max_bytes = max_bytes
        self.keep = keep
        self._clock = clock
        self._fd: int | None = None
        self.last_seq = 0
        self._changed: asyncio.Condition | None = None

    def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            self.last_seq = self._last_seq_on_disk()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
            self._end_torn_line()
        except OSError as exc:
            raise EventLogError(f"could not open event log {self.path}: {exc.strerror}") from exc

    def _end_torn_line(self) -> None:
        """A crash mid-write leaves a line without its newline: end it so the next event starts clean."""
        size = os.fstat(self._fd).st_size
        if size:
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self._fd, b"\n")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _last_seq_on_disk(self) -> int:
        for path in self.files()[::-1]:
            last = None
            for event in _read_lines(path):
                last = event
            if last is not None:
                return int(last.get("seq", 0))
        return 0

    def files(self) -> list[Path]:
        """Oldest first."""
        rotated = [self.path.with_name(f"{EVENTS_FILE}.{i}") for i in range(self.keep, 0, -1)]
        return [p for p in (*rotated, self.path) if p.exists()]

    def append(self, level: str = "info", **fields) -> dict:
        """Write one event (fsynced) and log it; returns it with its seq and time."""
        if self._fd is None:
            self.open()
        self.last_seq += 1
        event = {"seq": self.last_seq, "time": self._clock(), **fields}
        line = (json.dumps(event, sort_keys=False, default=str) + "\n").encode()
        try:
            if os.fstat(self._fd).st_size + len(line) > self.max_bytes:
                self._rotate()
            os.write(self._fd, line)
            os.fsync(self._fd)
        except OSError as exc:
            log_event(log, "event_log_failed", logging.ERROR, path=self.path, error=exc.strerror)
        log_event(log, "watch", _LEVELS.get(level, logging.INFO),
                  **{k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in event.items() if k != "time"})
        if self._changed is not None:
            asyncio.get_running_loop().create_task(self._notify())
        return event

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _rotate(self) -> None:
        os.close(self._fd)
        oldest = self.path.with_name(f"{EVENTS_FILE}.{self.keep}")
        oldest.unlink(missing_ok=True)
        for i in range(self.keep - 1, 0, -1):
            src = self.path.with_name(f"{EVENTS_FILE}.{i}")
            if src.exists():
                src.rename(self.path.with_name(f"{EVENTS_FILE}.{i + 1}"))
        self.path.rename(self.path.with_name(f"{EVENTS_FILE}.1"))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def read(self, *, since: float | None = None, after_seq: int = 0, limit: int = 1000) -> list[dict]:
        """Events with seq > after_seq and time >= since, oldest first, at most the newest `limit`."""
        found = [e for p in self.files() for e in _read_lines(p)
                 if e.get("seq", 0) > after_seq and (since is None or e.get("time", 0) >= since)]
        return found[-limit:] if limit else found

    async def wait(self, after_seq: int, timeout_seconds: float) -> None:
        """Return when an event newer than after_seq exists, or after timeout_seconds."""
        if self._changed is None:
            self._changed = asyncio.Condition()
        if self.last_seq > after_seq:
            return
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.last_seq > after_seq), timeout_seconds)
            except TimeoutError:
                pass


def _read_lines(path: Path) -> Iterator[dict]:
    try:
        with open(path, "rb") as f:
            for raw in f:
                try:
                    yield json.loads(raw)
                except ValueError:
                    continue  # a line torn by a crash mid-write; the rest of the file is intact
    except FileNotFoundError:
        return
