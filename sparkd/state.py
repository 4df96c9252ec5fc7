"""What sparkd placed, persisted in state_dir so a restarted sparkd knows its services' history.

The backend is the truth about what runs (adopt()); this file adds what the backend cannot know
after a restart: when sparkd started a service and how its last run ended. Written atomically
(temporary file, fsync, rename, fsync of the directory) so a crash never leaves half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .errors import SparkdError

STATE_FILE = "state.json"
_VERSION = 1


class StateError(SparkdError):
    """The state file cannot be read or written."""


@dataclass
class ServiceRecord:
    name: str
    backend: str
    unit: str
    cgroup: str | None = None
    started_at: float | None = None  # unix time of the last start by sparkd
    stopped_at: float | None = None
    # systemd's Result vocabulary (success, exit-code, signal, oom-kill ...), or start-failed when
    # the backend refused the start itself (then last_message says why).
    last_result: str | None = None
    last_exit_status: int | None = None
    last_message: str | None = None
    running: bool = False


class StateStore:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / STATE_FILE
        self.services: dict[str, ServiceRecord] = {}

    def load(self) -> dict[str, ServiceRecord]:
        """Read the file; a missing file is an empty state, a corrupt one an error naming it."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            self.services = {}
            return self.services
        except OSError as exc:
            raise StateError(f"could not read state {self.path}: {exc.strerror}") from exc
        self.services = self._parse(text)
        return self.services

    def _parse(self, text: str) -> dict[str, ServiceRecord]:
        what_to_do = "move it aside to start with an empty state (running services are re-adopted from the backend)"
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("version") != _VERSION:
                raise ValueError(f"expected an object with version {_VERSION}")
            known = {f.name for f in fields(ServiceRecord)}
            return {
                name: ServiceRecord(**{k: v for k, v in rec.items() if k in known})
                for name, rec in data["services"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateError(f"could not parse state {self.path}: {exc}; {what_to_do}") from None

    def save(self) -> None:
        data = {"version": _VERSION, "services": {n: asdict(r) for n, r in sorted(self.services.items())}}
        payload = json.dumps(data, indent=2, sort_keys=True).encode()
        directory = self.path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o755)
            fd, tmp = tempfile.mkstemp(prefix=".state.", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise StateError(f"could not write state {self.path}: {exc.strerror}") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, self.path)
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise StateError(f"could not write state {self.path}: {exc.strerror}") from exc

    def update(self, name: str, **changes) -> ServiceRecord:
        """Change one record (creating it) and save."""
        record = self.services.get(name)
        if record is None:
            record = ServiceRecord(name=name, backend=changes.pop("backend", ""), unit=changes.pop("unit", ""))
            self.services[name] = record
        for key, value in changes.items():
            setattr(record, key, value)
        self.save()
        return record
