"""Structured, journal-friendly logging: one line per event, `event=NAME key=value ...`.

When stderr is connected to the journal (systemd sets JOURNAL_STREAM to its device:inode), each
line is prefixed with a syslog priority `<N>` so `journalctl -p warning` filters correctly.
"""

from __future__ import annotations

import logging
import os
import sys

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n\t'):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return text


def kv(event: str, **fields: object) -> str:
    """'event=start service=llm unit=sparkd-llm.service' (None values are left out)."""
    parts = [f"event={_quote(event)}"]
    parts += [f"{key}={_quote(val)}" for key, val in fields.items() if val is not None]
    return " ".join(parts)


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: object) -> None:
    logger.log(level, "%s", kv(event, **fields))


class _Formatter(logging.Formatter):
    def __init__(self, journal: bool):
        super().__init__()
        self._journal = journal

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if not msg.startswith("event="):
            msg = kv("log", logger=record.name, msg=msg)
        level = f"level={record.levelname.lower()}"
        if self._journal:
            return f"<{_PRIORITY.get(record.levelno, 6)}>{level} {msg}"
        return f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} {level} {msg}"


def stderr_is_journal(journal_stream: str | None, stream=sys.stderr) -> bool:
    """True when stream is the journal socket named by JOURNAL_STREAM ('dev:ino')."""
    if not journal_stream:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return False
    return journal_stream == f"{st.st_dev}:{st.st_ino}"


def setup_logging(*, journal: bool, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(journal))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
