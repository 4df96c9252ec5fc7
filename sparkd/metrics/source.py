"""What the collector needs to know about each service, gathered from the supervisor.

The backend is asked (asynchronously, in the daemon's loop) right before each scrape; the
collector itself is synchronous and only reads the views handed to it plus the cgroup files.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..usage import resolve_cgroup_dir

# systemd's ActiveState values; sparkd_service_state has one series per value (1 for the current).
ACTIVE_STATES = ("active", "activating", "deactivating", "inactive", "failed")
_RUNNING = ("active", "activating", "reloading", "deactivating")


@dataclass(frozen=True)
class ServiceView:
    name: str
    state: str  # one of ACTIVE_STATES
    backend: str
    unit: str
    cgroup_dir: Path | None  # the live cgroup directory, None when not running
    memory_max_policy_bytes: int | None  # None: not in the policy (adopted leftover)
    memory_enforced: bool  # what the backend says about the kernel enforcing memory.max
    last_result: str | None = None
    memory_high_policy_bytes: int | None = None  # None: no memory_high in the policy


def state_without_backend(last_result: str | None) -> str:
    """A service the backend no longer knows: inactive after a clean end, failed otherwise."""
    return "inactive" if last_result in (None, "success") else "failed"


class SupervisorSource:
    """Callable returning the latest views; refresh() asks the backend (await it before a scrape)."""

    def __init__(self, supervisor: Any, cgroup2_mount: Path | None):
        self._supervisor = supervisor
        self._mount = cgroup2_mount
        self._views: list[ServiceView] = []

    def __call__(self) -> list[ServiceView]:
        return self._views

    async def refresh(self) -> None:
        sup = self._supervisor
        names = sorted(set(sup.policy.services) | set(sup.state.services))
        statuses = await asyncio.gather(*(sup.placement.status(n) for n in names))
        self._views = [self._view(n, s) for n, s in zip(names, statuses)]
        self._publish_watcher_health()

    def _publish_watcher_health(self) -> None:
        """Each detector's state as sparkd_watcher_up; keys are 'detector' or 'detector@service'."""
        watchers = getattr(self._supervisor, "watchers", None)
        if watchers is None:
            return
        for key, health in watchers.health()["detectors"].items():
            watcher, _, service = key.partition("@")
            mode = health.get("mode") or health["state"]
            self._supervisor.counters.watcher_health(watcher, health["state"] == "running", str(mode), service)

    def _view(self, name: str, current: Any) -> ServiceView:
        sup = self._supervisor
        service = sup.policy.services.get(name)
        record = sup.state.services.get(name)
        last_result = record.last_result if record else None
        running = current is not None and current.active_state in _RUNNING
        cgroup = (current.cgroup if current else None) or (record.cgroup if record else None)
        if current is not None:
            state = "active" if current.active_state == "reloading" else current.active_state
        else:
            state = state_without_backend(last_result)
        return ServiceView(
            name=name,
            state=state if state in ACTIVE_STATES else "failed",
            backend=current.backend if current else (record.backend if record and record.backend else sup.placement.name),
            unit=current.unit if current else (record.unit if record else ""),
            cgroup_dir=resolve_cgroup_dir(cgroup, self._mount) if running else None,
            memory_max_policy_bytes=service.memory_max if service else None,
            memory_enforced=bool(current.memory_enforced) if current else sup.placement.memory_enforced,
            last_result=last_result,
            memory_high_policy_bytes=service.memory_high if service else None,
        )
