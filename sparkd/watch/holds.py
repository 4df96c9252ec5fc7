"""Start holds: after a refuse_starts action, starts are refused until `sparkctl clear`.

Persisted in state_dir (atomically, like the state file) so a sparkd restart does not forget that
the operator has something to look at. A hold on "*" (from a system-wide rule) refuses every start.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..errors import GuardRefusal, SparkdError

HOLDS_FILE = "holds.json"
ALL = "*"


class Holds:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / HOLDS_FILE
        self.holds: dict[str, dict] = {}

    def load(self) -> None:
        try:
            self.holds = json.loads(self.path.read_text())
        except FileNotFoundError:
            self.holds = {}
        except (OSError, ValueError) as exc:
            raise SparkdError(f"could not read start holds {self.path}: {exc}; remove the file to clear every hold") from exc

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd, tmp = tempfile.mkstemp(prefix=".holds.", dir=self.path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(self.holds, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.path)

    def add(self, service: str | None, rule: str, reason: str, since: float) -> None:
        self.holds[service or ALL] = {"rule": rule, "reason": reason, "since": since}
        self._save()

    def check(self, service: str) -> None:
        """Raise GuardRefusal when a hold stops this service from starting."""
        for key in (service, ALL):
            hold = self.holds.get(key)
            if hold is not None:
                scope = "every start" if key == ALL else f"starts of {service}"
                raise GuardRefusal(
                    f"could not start {service}: {scope} refused since watcher rule {hold['rule']!r} acted "
                    f"({hold['reason']}); look at `sparkctl events`, then run `sparkctl clear`",
                    [{"rule": hold["rule"], "reason": hold["reason"], "hold": key}],
                )

    def clear(self, service: str | None = None) -> list[str]:
        """Remove the hold of one service (and the global one), or every hold; the names removed."""
        keys = list(self.holds) if service is None else [k for k in (service, ALL) if k in self.holds]
        for key in keys:
            del self.holds[key]
        self._save()
        return keys
