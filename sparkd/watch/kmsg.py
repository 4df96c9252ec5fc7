"""/dev/kmsg reader: one structured record per read(), `prio,seq,usec,flags[,...];text` followed by
continuation lines ` KEY=value` (the record's dictionary).

It starts at the end of the log (old lines are history) unless told to resume after a sequence
number from an earlier run in the same boot, so lines logged while sparkd was down are not lost.
When the reader falls behind by more than the kernel's ring buffer the read fails with EPIPE and
the kernel moves it to the oldest record still there: that overrun is reported with the number of
records lost, and reading goes on.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_KMSG_PATH = Path("/dev/kmsg")
DEFAULT_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
# One record is at most about 1 KiB of text plus its dictionary; 8 KiB leaves room (a smaller
# buffer than the record makes read() fail with EINVAL).
READ_BUFFER_BYTES = 8192
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


class KmsgError(Exception):
    """A record could not be parsed or the log could not be read."""


@dataclass(frozen=True)
class KmsgRecord:
    priority: int  # syslog facility * 8 + level
    seq: int
    usec: int  # since boot
    flags: str  # '-' a whole record, 'c' a continued one
    text: str
    fields: dict[str, str] = field(default_factory=dict)  # the continuation lines (SUBSYSTEM=..., DEVICE=...)

    @property
    def level(self) -> int:
        return self.priority & 7


def parse_record(raw: bytes) -> KmsgRecord:
    head, sep, rest = raw.partition(b";")
    parts = head.split(b",")
    if not sep or len(parts) < 4 or not all(p.strip().isdigit() for p in parts[:3]):
        raise KmsgError(f"could not parse kmsg record {raw[:80]!r}: expected 'prio,seq,usec,flags;text'")
    lines = rest.split(b"\n")
    text = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), lines[0]).decode(errors="replace")
    extra = {}
    for line in lines[1:]:
        if line.startswith(b" "):
            key, _, value = line[1:].partition(b"=")
            extra[key.decode(errors="replace")] = value.decode(errors="replace")
    return KmsgRecord(int(parts[0]), int(parts[1]), int(parts[2]), parts[3].decode(errors="replace"), text, extra)


def read_boot_id(path: Path = DEFAULT_BOOT_ID_PATH) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


class KmsgReader:
    name = "kmsg"

    def __init__(self, on_record: Callable[[KmsgRecord], None], on_overrun: Callable[[int], None], *,
                 path: Path = DEFAULT_KMSG_PATH, resume_after_seq: int | None = None,
                 buffer_bytes: int = READ_BUFFER_BYTES):
        self.path = Path(path)
        self._on_record = on_record
        self._on_overrun = on_overrun
        self._resume_after_seq = resume_after_seq
        self._buffer_bytes = buffer_bytes
        self.last_seq: int | None = resume_after_seq
        self.overruns = 0
        self.mode = "resume" if resume_after_seq is not None else "tail"

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if self._resume_after_seq is None:
            os.lseek(fd, 0, os.SEEK_END)
        return fd

    def drain(self, fd: int) -> None:
        """Read every record available now."""
        overrun = False
        while True:
            try:
                raw = os.read(fd, self._buffer_bytes)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    overrun = True  # the kernel has moved us to the oldest record still kept
                    continue
                raise KmsgError(f"could not read {self.path}: {exc.strerror}") from exc
            if not raw:
                return
            record = parse_record(raw)
            if self.last_seq is not None and record.seq <= self.last_seq:
                continue  # seen by an earlier run (resume)
            lost = record.seq - self.last_seq - 1 if self.last_seq is not None else 0
            if overrun or lost > 0:
                self.overruns += 1
                self._on_overrun(max(lost, 0))
                overrun = False
            self.last_seq = record.seq
            self._on_record(record)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        fd = self._open()
        loop.add_reader(fd, ready.set)
        try:
            while True:
                self.drain(fd)
                await ready.wait()
                ready.clear()
        finally:
            loop.remove_reader(fd)
            os.close(fd)
