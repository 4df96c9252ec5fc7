"""Counters the supervisor and the watchers increment, read by the collector on each scrape.

Plain numbers behind one lock (the supervisor runs in the event loop, scrapes and watcher
threads may not), so the owners call small methods with their own vocabulary and never touch
prometheus_client. Label values come from bounded sets: policy names (services, rules,
watchers), systemd's result words, guard names, Xid numbers and the buckets below.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

# How the kernel-log watcher classifies an NVRM line (issue 7): Xid application faults
# (13, 31, 43, 45, 94), node faults (48, 63, 64, 74, 79, 92, 95, 119, 120, 154), the driver's
# out-of-memory checks (NV_ERR_NO_MEMORY, "Out of memory"), anything else.
NVRM_BUCKETS = frozenset({"application", "node", "out_of_memory", "other"})
# What became of an action a rule decided on.
ACTION_OUTCOMES = frozenset({"done", "dry_run", "failed", "skipped"})
NO_XID = "none"  # xid label of an NVRM line that carries no Xid number (an out-of-memory check)


@dataclass(frozen=True)
class WatcherHealth:
    up: bool
    mode: str  # how it watches: "trigger", "trigger_2s", "poll", "kmsg", "nvml" ...


def guard_reason(check_name: str) -> str:
    """'headroom[llm]' -> 'headroom', 'competitor[ollama.service]' -> 'competitor'."""
    return check_name.split("[", 1)[0]


class SparkdCounters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: Counter[str] = Counter()
        self._stops: Counter[str] = Counter()
        self._exits: Counter[tuple[str, str]] = Counter()  # (service, result)
        self._refusals: Counter[tuple[str, str]] = Counter()  # (service, reason)
        self._evictions: Counter[str] = Counter()  # competitor unit or process name
        self._nvrm: Counter[tuple[str, str]] = Counter()  # (xid, bucket)
        self._actions: Counter[tuple[str, str, str]] = Counter()  # (rule, action, outcome)
        self._watcher_errors: Counter[tuple[str, str]] = Counter()  # (watcher, service)
        self._watchers: dict[tuple[str, str], WatcherHealth] = {}
        self._scrape_errors: Counter[str] = Counter()

    # --- supervisor -----------------------------------------------------------------------------

    def service_started(self, service: str) -> None:
        with self._lock:
            self._starts[service] += 1

    def service_stopped(self, service: str) -> None:
        """A stop sparkd was asked for (sparkctl stop, shutdown, a watcher's stop action)."""
        with self._lock:
            self._stops[service] += 1

    def service_ended(self, service: str, result: str) -> None:
        """A run ended, with systemd's Result word (success, exit-code, oom-kill, start-failed ...)."""
        with self._lock:
            self._exits[(service, result or "unknown")] += 1

    def observe_preflight(self, report: dict[str, Any]) -> None:
        """Count what a real (not dry-run) preflight did: refusals by guard, competitor evictions."""
        service = report.get("service") or ""
        with self._lock:
            for check in report.get("checks", []):
                if check["status"] == "refused":
                    self._refusals[(service, guard_reason(check["name"]))] += 1
                elif check["status"] == "ok" and check["name"].startswith("competitor"):
                    for culprit in check.get("culprits", ()):
                        if culprit.get("detail") not in ("", "ignored", None):
                            self._evictions[culprit.get("name") or "?"] += 1

    # --- watchers -------------------------------------------------------------------------------

    def nvrm_event(self, xid: int | None, bucket: str) -> None:
        if bucket not in NVRM_BUCKETS:
            raise ValueError(f"unknown NVRM bucket {bucket!r}; expected one of {sorted(NVRM_BUCKETS)}")
        with self._lock:
            self._nvrm[(NO_XID if xid is None else str(int(xid)), bucket)] += 1

    def action(self, rule: str, action: str, outcome: str) -> None:
        if outcome not in ACTION_OUTCOMES:
            raise ValueError(f"unknown action outcome {outcome!r}; expected one of {sorted(ACTION_OUTCOMES)}")
        with self._lock:
            self._actions[(rule, action, outcome)] += 1

    def watcher_health(self, watcher: str, up: bool, mode: str, service: str = "") -> None:
        """The current health of one detector (service '' for a system-wide one)."""
        with self._lock:
            self._watchers[(watcher, service)] = WatcherHealth(up, mode)

    def watcher_error(self, watcher: str, service: str = "") -> None:
        with self._lock:
            self._watcher_errors[(watcher, service)] += 1

    def watcher_removed(self, watcher: str, service: str = "") -> None:
        """A detector that no longer exists (its service was removed) stops being reported."""
        with self._lock:
            self._watchers.pop((watcher, service), None)

    # --- the collector itself -------------------------------------------------------------------

    def scrape_error(self, source: str) -> None:
        with self._lock:
            self._scrape_errors[source] += 1

    def snapshot(self) -> dict[str, dict]:
        """Copies of every table, taken under the lock, for one scrape."""
        with self._lock:
            return {
                "starts": dict(self._starts), "stops": dict(self._stops), "exits": dict(self._exits),
                "refusals": dict(self._refusals), "evictions": dict(self._evictions),
                "nvrm": dict(self._nvrm), "actions": dict(self._actions),
                "watcher_errors": dict(self._watcher_errors), "watchers": dict(self._watchers),
                "scrape_errors": dict(self._scrape_errors),
            }
