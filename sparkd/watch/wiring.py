"""Connects the watchers to the supervisor: what services run where, how to stop one, the start
holds, the engine's listen address and the competitor guard."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..errors import PolicyError
from ..guards.competitors import check_competitors
from ..policy import read_api_key
from ..usage import cgroup_pids, find_cgroup2_mount, resolve_cgroup_dir


class SupervisorControl:
    """The watchers' ServiceControl over a sparkd.supervisor.Supervisor."""

    def __init__(self, supervisor: Any, guard_ctx: Any = None, *, cgroup2_mount: Path | None = None,
                 clock=time.time):
        self._supervisor = supervisor
        self._cgroup2_mount = cgroup2_mount if cgroup2_mount is not None else find_cgroup2_mount()
        self._guard_ctx = guard_ctx
        self._clock = clock

    def running_services(self) -> dict[str, Path | None]:
        return {name: resolve_cgroup_dir(record.cgroup, self._cgroup2_mount)
                for name, record in self._supervisor.state.services.items() if record.running}

    def service_of_pid(self, pid: int) -> str | None:
        for name, cgroup in self.running_services().items():
            if cgroup is not None and pid in cgroup_pids(cgroup):
                return name
        return None

    async def stop_service(self, name: str) -> str:
        return (await self._supervisor.stop(name))["message"]

    def hold_starts(self, name: str | None, rule: str, reason: str) -> None:
        self._supervisor.watchers.holds.add(name, rule, reason, self._clock())

    def _embedded(self, name: str) -> Any:
        service = self._supervisor.policy.services.get(name)
        return service.engine.embedded if service is not None else None

    def engine_listen(self, name: str) -> str | None:
        embedded = self._embedded(name)
        return embedded.listen if embedded is not None else None

    def engine_api_key(self, name: str) -> str | None:
        embedded = self._embedded(name)
        path = embedded.api_key_file if embedded is not None else None
        if path is None:
            return None
        try:
            return read_api_key(path)
        except PolicyError as exc:
            raise RuntimeError(f"{exc} (services.{name}.engine.embedded.api_key_file)") from exc

    async def evict_competitors(self) -> list[Any]:
        ctx = self._guard_ctx
        return await check_competitors(
            self._supervisor.policy.guards, unit_manager=getattr(ctx, "unit_manager", None),
            no_unit_manager_reason=getattr(ctx, "no_unit_manager_reason", ""), dry_run=False)
