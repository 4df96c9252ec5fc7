"""The asyncio core of sparkd: adopt what runs, start (after the guards) and stop services, and
report their state. It never restarts a service (Restart=no) and never kills or duplicates a
service a previous sparkd started.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .engine_probe import probe_engine
from .errors import PlacementError, SparkdError
from .logfmt import log_event
from .metrics.counters import SparkdCounters
from .placement.base import Placement, ServiceStatus, unit_name
from .policy import Policy
from .sizes import format_size
from .specs import ENGINE_EXECUTABLE, build_spec
from .state import StateStore
from .system.gpu import GpuReader, GpuSnapshot
from .system.meminfo import DEFAULT_MEMINFO_PATH, read_meminfo
from .usage import cgroup_pids, find_cgroup2_mount, read_usage, resolve_cgroup_dir

log = logging.getLogger("sparkd.supervisor")

# preflight(policy, service_name, dry_run=...) -> sparkd.guards.PreflightReport; dry_run only
# reports what evicting a competitor would do (sparkctl preflight), a start really evicts.
PreflightFn = Callable[..., Awaitable[Any]]
_RUNNING = ("active", "activating", "reloading", "deactivating")


class UnknownService(SparkdError):
    """A service name that is not in the policy."""


def report_dict(report: Any) -> dict:
    """A guard report (sparkd.guards PreflightReport) as JSON-ready data, with its human text."""
    return {**report.to_dict(), "text": report.render()}


def _api_key_file(service: Any) -> str | None:
    """The path (never the key) of an embedded engine's api_key_file: sparkctl bench reads it."""
    embedded = service.engine.embedded if service is not None else None
    path = embedded.api_key_file if embedded is not None else None
    return str(path) if path is not None else None


class Supervisor:
    def __init__(
        self,
        policy: Policy,
        placement: Placement,
        preflight: PreflightFn,
        state: StateStore,
        *,
        placement_reason: str = "",
        cgroup2_mount: Path | None = None,
        engine_executable: str = ENGINE_EXECUTABLE,
        gpu_reader: GpuReader | None = None,
        clock: Callable[[], float] = time.time,
        meminfo_path: Path = DEFAULT_MEMINFO_PATH,
        counters: SparkdCounters | None = None,
    ):
        self.policy = policy
        self.placement = placement
        self._preflight = preflight
        self.state = state
        self.placement_reason = placement_reason
        self._cgroup2_mount = cgroup2_mount if cgroup2_mount is not None else find_cgroup2_mount()
        self._engine_executable = engine_executable
        self._gpu_reader = gpu_reader if gpu_reader is not None else GpuReader()
        self._clock = clock
        self._meminfo_path = meminfo_path
        self.counters = counters if counters is not None else SparkdCounters()  # read by sparkd.metrics
        self._locks: dict[str, asyncio.Lock] = {}
        self._last_preflight: dict[str, dict] = {}
        self.started_at = clock()
        # sparkd.watch.WatchManager, set by the daemon: its start holds refuse starts, it follows
        # services as they start and stop, and its health is part of the status.
        self.watchers: Any = None

    def _watchers_sync(self) -> None:
        if self.watchers is not None:
            self.watchers.sync_services()

    # --- life cycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Load the state, adopt what the backend still runs, then start autostart services."""
        self.state.load()
        adopted = await self.placement.adopt()
        self._reconcile(adopted)
        running = {s.name for s in adopted if s.active_state in _RUNNING}
        self._watchers_sync()
        for name, service in self.policy.services.items():
            if service.autostart and name not in running:
                try:
                    await self.start(name)
                except SparkdError as exc:
                    # A refused or failed autostart is reported; the daemon keeps serving.
                    log_event(log, "autostart_failed", logging.ERROR, service=name, error=exc)

    def _reconcile(self, adopted: list[ServiceStatus]) -> None:
        seen = set()
        for status in adopted:
            seen.add(status.name)
            known = status.name in self.state.services
            running = status.active_state in _RUNNING
            changes: dict[str, Any] = {"backend": status.backend, "unit": status.unit, "cgroup": status.cgroup, "running": running}
            if not running:  # ended while sparkd was away, and the backend kept its result
                changes.update(last_result=status.result, last_exit_status=status.exec_main_status, last_message=status.message)
            self.state.update(status.name, **changes)
            log_event(
                log, "adopted", service=status.name, backend=status.backend, unit=status.unit,
                state=status.active_state, main_pid=status.main_pid, cgroup=status.cgroup,
                in_state_file=known, in_policy=status.name in self.policy.services,
            )
        for name, record in self.state.services.items():
            if record.running and name not in seen:
                # It ended while no sparkd was watching: its result is lost, say so.
                self.state.update(name, running=False, last_result="unknown", stopped_at=self._clock())
                log_event(log, "lost", logging.WARNING, service=name, unit=record.unit,
                          reason="ended while sparkd was not running")

    async def shutdown(self) -> None:
        """On SIGTERM: engines keep running unless daemon.stop_services_on_exit."""
        if not self.policy.daemon.stop_services_on_exit:
            running = [n for n, r in self.state.services.items() if r.running]
            log_event(log, "leaving_services_running", services=",".join(running) or "-",
                      reason="daemon.stop_services_on_exit is false")
            return
        for name, record in list(self.state.services.items()):
            if record.running:
                try:
                    await self.stop(name)
                except SparkdError as exc:
                    log_event(log, "stop_failed", logging.ERROR, service=name, error=exc)

    # --- backend events -----------------------------------------------------------------------

    def on_change(self, status: ServiceStatus) -> None:
        """Backend callback: record how a run ended. Never restarts."""
        running = status.active_state in _RUNNING
        changes: dict[str, Any] = {"backend": status.backend, "unit": status.unit, "running": running}
        self._count_end(status.name, running, status.result)
        if status.cgroup:
            changes["cgroup"] = status.cgroup
        if not running:
            changes.update(last_result=status.result, last_exit_status=status.exec_main_status,
                           last_message=status.message, stopped_at=self._clock())
        self.state.update(status.name, **changes)
        level = logging.WARNING if (not running and status.result != "success") else logging.INFO
        log_event(log, "state_changed", level, service=status.name, state=status.active_state,
                  sub_state=status.sub_state, result=status.result, exit_status=status.exec_main_status,
                  main_pid=status.main_pid, message=status.message or None)
        self._watchers_sync()

    def _count_end(self, name: str, running: bool, result: str) -> None:
        """Count a run's end once, whichever of on_change and stop() records it first."""
        record = self.state.services.get(name)
        if record is not None and record.running and not running:
            self.counters.service_ended(name, result)

    # --- commands -----------------------------------------------------------------------------

    def _service(self, name: str):
        service = self.policy.services.get(name)
        if service is None:
            known = ", ".join(sorted(self.policy.services)) or "none"
            raise UnknownService(f"could not find service {name!r} in the policy (services: {known})")
        return service

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _enforcement_warnings(self, service) -> list[str]:
        if self.placement.memory_enforced:
            return []
        why = self.placement.why_not_enforced or "the memory controller is not available"
        return [f"memory_max {format_size(service.memory_max)} is NOT enforced: {why}"]

    async def run_preflight(self, name: str, *, dry_run: bool) -> Any:
        self._service(name)
        report = await self._preflight(self.policy, name, dry_run=dry_run)
        data = report_dict(report)
        data["checked_at"] = self._clock()
        self._last_preflight[name] = data
        if not dry_run:
            self.counters.observe_preflight(data)
        log_event(log, "preflight", service=name, refused=data["refused"], dry_run=dry_run)
        for check in data.get("checks", []):
            # What the guards did or found (an eviction, a skipped GPU guard) is logged, not hidden.
            if check["status"] != "ok" or check["name"].startswith("competitor"):
                log_event(log, "guard", service=name, check=check["name"], status=check["status"],
                          message=check["message"], policy_key=check.get("policy_key"))
        return report

    async def preflight(self, name: str | None = None) -> dict:
        names = [name] if name is not None else sorted(self.policy.services)
        reports = {}
        for n in names:
            await self.run_preflight(n, dry_run=True)
            reports[n] = self._last_preflight[n]
        return {"refused": any(r["refused"] for r in reports.values()), "services": reports}

    async def start(self, name: str) -> dict:
        service = self._service(name)
        async with self._lock(name):
            current = await self.placement.status(name)
            if current is not None and current.active_state in _RUNNING:
                log_event(log, "start_skipped", service=name, reason="already running", main_pid=current.main_pid)
                return {"service": name, "started": False, "message": f"{name} is already running",
                        "status": current.to_dict(), "warnings": self._enforcement_warnings(service)}
            if self.watchers is not None:
                self.watchers.holds.check(name)  # raises GuardRefusal until `sparkctl clear`
            report = await self.run_preflight(name, dry_run=False)
            refusal = report.refusal()
            if refusal is not None:
                log_event(log, "start_refused", logging.WARNING, service=name, culprits=len(refusal.culprits))
                raise refusal
            spec = build_spec(name, service, self._engine_executable)
            log_event(log, "starting", service=name, backend=self.placement.name, argv=" ".join(spec.argv),
                      memory_max_bytes=spec.memory_max_bytes, memory_enforced=self.placement.memory_enforced)
            try:
                status = await self.placement.start(spec)
            except PlacementError as exc:
                self.state.update(name, backend=self.placement.name, unit=unit_name(name), running=False,
                                  last_result="start-failed", last_exit_status=None, last_message=str(exc),
                                  stopped_at=self._clock())
                log_event(log, "start_failed", logging.ERROR, service=name, error=exc)
                self.counters.service_ended(name, "start-failed")
                raise
            self.state.update(name, backend=status.backend, unit=status.unit, cgroup=status.cgroup,
                              started_at=self._clock(), running=status.active_state in _RUNNING)
            self.counters.service_started(name)
            if status.active_state not in _RUNNING:
                raise self._ended_at_once(status)
            log_event(log, "started", service=name, unit=status.unit, main_pid=status.main_pid,
                      cgroup=status.cgroup, state=status.active_state)
            self._watchers_sync()
            return {"service": name, "started": True, "message": f"{name} started ({status.unit})",
                    "status": status.to_dict(), "warnings": self._enforcement_warnings(service)}

    def _ended_at_once(self, status: ServiceStatus) -> PlacementError:
        self.state.update(status.name, last_result=status.result, last_exit_status=status.exec_main_status,
                          last_message=status.message, stopped_at=self._clock())
        log_event(log, "start_failed", logging.ERROR, service=status.name, result=status.result,
                  exit_status=status.exec_main_status)
        self.counters.service_ended(status.name, status.result)
        detail = f"result {status.result}, exit status {status.exec_main_status}"
        more = f"; {status.message}" if status.message else ""
        return PlacementError(f"could not start {status.name}: it ended at once ({detail}){more}; not restarted (Restart=no)")

    async def stop(self, name: str) -> dict:
        record = self.state.services.get(name)
        service = self.policy.services.get(name)
        if service is None and record is None:
            self._service(name)  # raises UnknownService
        timeout_seconds = service.stop_timeout if service is not None else 30.0
        async with self._lock(name):
            current = await self.placement.status(name)
            if current is None or current.active_state not in _RUNNING:
                return {"service": name, "stopped": False, "message": f"{name} is not running",
                        "status": current.to_dict() if current else None}
            log_event(log, "stopping", service=name, unit=current.unit, timeout_seconds=timeout_seconds)
            final = await self.placement.stop(name, timeout_seconds)
            self.counters.service_stopped(name)
            self._count_end(name, False, final.result)
            self.state.update(name, backend=final.backend, unit=final.unit, running=False,
                              last_result=final.result, last_exit_status=final.exec_main_status,
                              stopped_at=self._clock())
            log_event(log, "stopped", service=name, result=final.result, exit_status=final.exec_main_status)
            self._watchers_sync()
            return {"service": name, "stopped": True, "message": f"{name} stopped (result {final.result})",
                    "status": final.to_dict()}

    # --- status -------------------------------------------------------------------------------

    async def _service_status(self, name: str, gpu: GpuSnapshot) -> dict:
        service = self.policy.services.get(name)
        record = self.state.services.get(name)
        current = await self.placement.status(name)
        cgroup = (current.cgroup if current else None) or (record.cgroup if record else None)
        running = current is not None and current.active_state in _RUNNING
        cgroup_dir = resolve_cgroup_dir(cgroup, self._cgroup2_mount) if running else None
        usage = read_usage(cgroup_dir)
        gpu_mib = None
        if gpu.available and cgroup_dir is not None:
            pids = cgroup_pids(cgroup_dir)
            gpu_mib = sum(p.used_mib or 0 for p in gpu.processes if p.pid in pids)
        return {
            "name": name,
            "in_policy": service is not None,
            "autostart": service.autostart if service else False,
            "state": current.active_state if current else "inactive",
            "sub_state": current.sub_state if current else "dead",
            "backend": current.backend if current else self.placement.name,
            "unit": current.unit if current else (record.unit if record else None),
            "cgroup": cgroup,
            "main_pid": current.main_pid if current else None,
            "memory_max_policy_bytes": service.memory_max if service else None,
            "memory_high_policy_bytes": service.memory_high if service else None,
            "api_key_file": _api_key_file(service),
            "memory_enforced": bool(current.memory_enforced) if current else self.placement.memory_enforced,
            **usage.to_dict(),
            "gpu_mib": gpu_mib,
            "started_at": record.started_at if record else None,
            "stopped_at": record.stopped_at if record else None,
            "last_result": record.last_result if record else None,
            "last_exit_status": record.last_exit_status if record else None,
            "last_message": record.last_message if record else None,
            "message": current.message if current else "",
            "guards": self._last_preflight.get(name),
            "engine": await self._engine(service, running),
        }

    def _system_memory(self) -> dict:
        """MemAvailable against the guards' reserve (what sparkctl top shows for the whole box)."""
        memory = {"mem_total_bytes": None, "mem_available_bytes": None,
                  "reserve_bytes": self.policy.guards.reserve, "reason": None}
        try:
            info = read_meminfo(self._meminfo_path)
        except SparkdError as exc:
            memory["reason"] = str(exc)
            return memory
        memory.update(mem_total_bytes=info.total_bytes, mem_available_bytes=info.available_bytes)
        return memory

    async def _engine(self, service, running: bool) -> dict | None:
        """An embedded engine's health and decode speed, from its own HTTP endpoints."""
        if service is None or service.engine.embedded is None or not running:
            return None
        return await probe_engine(service.engine.embedded.listen)

    async def status(self) -> dict:
        names = sorted(set(self.policy.services) | set(self.state.services))
        gpu = await asyncio.to_thread(self._gpu_reader.read)
        services = [await self._service_status(n, gpu) for n in names]
        return {
            "daemon": {
                "pid": os.getpid(),
                "started_at": self.started_at,
                "placement": self.placement.name,
                "placement_reason": self.placement_reason,
                "memory_enforced": self.placement.memory_enforced,
                "why_not_enforced": self.placement.why_not_enforced,
                "gpu_available": gpu.available,
                "gpu_reason": gpu.reason,
                "state_dir": str(self.policy.daemon.state_dir),  # where sparkctl bench keeps its history
            },
            "services": services,
            "system": self._system_memory(),
            "guards": {
                "refused": sorted(n for n, r in self._last_preflight.items() if r["refused"]),
                "checked": sorted(self._last_preflight),
            },
            "watchers": self.watchers.health() if self.watchers is not None else None,
        }
