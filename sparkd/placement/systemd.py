"""Placement through systemd: each service is a transient unit sparkd-NAME.service in a slice.

systemd owns the cgroup (MemoryMax, MemorySwapMax, OOMPolicy) and the process; sparkd starts
the unit over D-Bus, follows JobRemoved / PropertiesChanged, and finds its units again after a
restart by name pattern, slice and Transient=yes (a unit it did not start is never touched).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

from sparkd.errors import PlacementError
from sparkd.placement.base import Placement, ServiceSpec, ServiceStatus, StatusCallback, unit_name
from sparkd.system.cgroups import find_cgroup2_mount
from sparkd.system.systemd_bus import BusCallError, SystemdBus, UnitSignal

log = logging.getLogger(__name__)

DEFAULT_SLICE = "sparkd.slice"
UNIT_PATTERN = "sparkd-*.service"
UNIT_PREFIX, UNIT_SUFFIX = "sparkd-", ".service"
# systemd fails a start job after its own TimeoutStartSec (90 s by default); wait a little longer.
START_JOB_TIMEOUT_SECONDS = 120.0
# After SIGKILL a stop job still needs the kernel to reap the cgroup; this bounds that wait.
KILL_GRACE_SECONDS = 10.0
# systemd's "infinity" for MemoryMax and friends.
UINT64_MAX = (1 << 64) - 1
CLD_EXITED = 1  # ExecMainCode: exited (2, 3: killed by a signal, dumped core)
# Exit statuses systemd's exec helper uses when it could not set the process up (systemd.exec(5)).
SETUP_FAILURE_STATUS = range(200, 244)
# ExecMainStatus values systemd's exec helper uses when it could not run the command.
EXEC_FAILURES = {
    200: "could not change to the working directory (200/CHDIR)",
    203: "could not execute the command: missing or not executable (203/EXEC)",
    217: "could not switch to the user (217/USER)",
}


def _engine_ran(props: dict | None) -> bool:
    """False when systemd's exec helper failed (status 200..243: EXIT_CHDIR, EXIT_EXEC, ...)."""
    if not props or not props.get("ExecMainCode"):
        return False
    return props["ExecMainCode"] != CLD_EXITED or props["ExecMainStatus"] not in SETUP_FAILURE_STATUS


def default_cgroup_root() -> Path:
    """The cgroup2 mount: /sys/fs/cgroup on pure v2 hosts, /sys/fs/cgroup/unified on hybrid ones."""
    return Path(find_cgroup2_mount() or "/sys/fs/cgroup")


class SystemdPlacement(Placement):
    name = "systemd"

    def __init__(
        self,
        slice_name: str = DEFAULT_SLICE,
        bus_address: str | None = None,
        cgroup_root: str | os.PathLike | None = None,
        on_change: StatusCallback | None = None,
    ):
        self.slice = slice_name
        self.bus = SystemdBus(bus_address)
        # Where systemd's "/" cgroup is on this filesystem; a subdirectory when systemd runs in
        # a cgroup namespace (the test sandbox).
        self.cgroup_root = Path(cgroup_root) if cgroup_root else default_cgroup_root()
        self.on_change = on_change
        self._connected = False
        self._tracked: set[str] = set()  # units whose changes go to on_change
        self._last: dict[str, tuple] = {}  # last reported (state, substate, result, status, pid)
        self._refreshing: set[str] = set()
        self._tasks: set[asyncio.Task] = set()

    # --- memory enforcement -----------------------------------------------------------------

    def _controllers(self, cgroup: Path) -> list[str] | None:
        try:
            return (cgroup / "cgroup.controllers").read_text().split()
        except OSError:
            return None

    @property
    def memory_enforced(self) -> bool:
        return "memory" in (self._controllers(self.cgroup_root) or [])

    @property
    def why_not_enforced(self) -> str:
        controllers = self._controllers(self.cgroup_root)
        if controllers is None:
            return f"no cgroup v2 tree at {self.cgroup_root}: MemoryMax is set on units but cannot be enforced"
        if "memory" in controllers:
            return ""
        return (
            f"the memory controller is not available in {self.cgroup_root}/cgroup.controllers "
            f"(has: {' '.join(controllers) or 'none'}; memory is probably on cgroup v1, a hybrid host): "
            "systemd accepts MemoryMax and MemorySwapMax but the kernel will not enforce them"
        )

    def _why_not_for(self, cgroup: Path | None) -> str:
        return self.why_not_enforced or f"the memory controller is not enabled in {cgroup}/cgroup.controllers"

    def _host_cgroup(self, control_group: str) -> Path | None:
        return self.cgroup_root / control_group.lstrip("/") if control_group else None

    # --- connection and signals ---------------------------------------------------------------

    async def _ensure_bus(self) -> SystemdBus:
        if not self._connected:
            await self.bus.connect()
            self._connected = True
            await self.bus.subscribe(self._on_signal)
        return self.bus

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
        if self._connected:
            await self.bus.close()
            self._connected = False

    def _on_signal(self, signal: UnitSignal) -> None:
        if signal.unit not in self._tracked or self.on_change is None or signal.unit in self._refreshing:
            return
        self._refreshing.add(signal.unit)
        task = asyncio.get_running_loop().create_task(self._refresh(signal.unit))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh(self, unit: str) -> None:
        """Re-read a unit after a signal and report it when something a caller sees changed."""
        try:
            await asyncio.sleep(0)  # let a burst of PropertiesChanged for this unit arrive first
            self._refreshing.discard(unit)
            props = await self.bus.unit_properties(unit)
            if unit not in self._tracked:  # a failed start, already reported by start()
                return
            status = self._status_from(unit, props) if props else self._gone_status(unit)
            key = (status.active_state, status.sub_state, status.result, status.exec_main_status, status.main_pid)
            if self._last.get(unit) != key:
                self._last[unit] = key
                self.on_change(status)
            if props is None:
                self._tracked.discard(unit)
        except Exception as exc:  # a watcher must survive a failed read or a failing callback
            self._refreshing.discard(unit)
            log.warning("Failed to report the state of %s, ignoring: %s", unit, exc)

    # --- status -----------------------------------------------------------------------------

    def _is_ours(self, props: dict) -> bool:
        return bool(props.get("Transient")) and props.get("Slice") == self.slice

    def _service_name(self, unit: str) -> str:
        return unit[len(UNIT_PREFIX) : -len(UNIT_SUFFIX)]

    def _status_from(self, unit: str, props: dict) -> ServiceStatus:
        cgroup = self._host_cgroup(props.get("ControlGroup", ""))
        enforced = "memory" in (self._controllers(cgroup) or []) if cgroup else self.memory_enforced
        memory_max, memory_high = props.get("MemoryMax"), props.get("MemoryHigh")
        pid = props.get("MainPID") or None
        return ServiceStatus(
            name=self._service_name(unit),
            backend=self.name,
            unit=unit,
            cgroup=str(cgroup) if cgroup else None,
            active_state=props.get("ActiveState", "inactive"),
            sub_state=props.get("SubState", "dead"),
            result=props.get("Result", "success"),
            exec_main_status=props.get("ExecMainStatus") if props.get("ExecMainCode") else None,
            main_pid=pid,
            memory_enforced=enforced,
            memory_max_bytes=None if memory_max in (None, UINT64_MAX) else memory_max,
            memory_high_bytes=None if memory_high in (None, UINT64_MAX) else memory_high,
            message="" if enforced else f"memory limit not enforced: {self._why_not_for(cgroup)}",
        )

    def _gone_status(self, unit: str) -> ServiceStatus:
        """A transient unit that ended cleanly is unloaded by systemd at once."""
        return ServiceStatus(name=self._service_name(unit), backend=self.name, unit=unit,
                             memory_enforced=self.memory_enforced, message="stopped and unloaded")  # fmt: skip

    async def status(self, name: str) -> ServiceStatus | None:
        unit = unit_name(name)
        props = await (await self._ensure_bus()).unit_properties(unit)
        if props is None or not self._is_ours(props):
            return None
        return self._status_from(unit, props)

    async def adopt(self) -> list[ServiceStatus]:
        bus = await self._ensure_bus()
        adopted = []
        for row in await bus.list_units([UNIT_PATTERN]):
            props = await bus.unit_properties(row["name"])
            if props is None or not self._is_ours(props) or props.get("ActiveState") == "inactive":
                continue
            self._tracked.add(row["name"])
            adopted.append(self._status_from(row["name"], props))
        return adopted

    # --- start ------------------------------------------------------------------------------

    def _unit_properties(self, spec: ServiceSpec, argv: list[str]) -> list[tuple[str, str, object]]:
        props = [
            ("Description", "s", spec.description or f"sparkd service {spec.name}"),
            ("Slice", "s", self.slice),
            # exec: the start job fails when the command cannot be executed, instead of succeeding
            # and failing a moment later.
            ("Type", "s", "exec"),
            ("ExecStart", "a(sasb)", [[argv[0], argv, False]]),
            ("Environment", "as", [f"{k}={v}" for k, v in spec.environment.items()]),
            ("MemoryAccounting", "b", True),
            ("MemoryMax", "t", spec.memory_max_bytes),
            ("MemorySwapMax", "t", spec.swap_max_bytes),
            ("OOMPolicy", "s", spec.oom_policy),
            ("KillMode", "s", "control-group"),
            ("TimeoutStopUSec", "t", int(spec.stop_timeout_seconds * 1_000_000)),
            ("Restart", "s", spec.restart),
        ]
        if spec.memory_high_bytes is not None:
            props.append(("MemoryHigh", "t", spec.memory_high_bytes))
        if spec.cpu_weight is not None:
            props.append(("CPUWeight", "t", spec.cpu_weight))
        if spec.working_directory:
            props.append(("WorkingDirectory", "s", spec.working_directory))
        if spec.user:
            props.append(("User", "s", spec.user))
        return props

    @staticmethod
    def _resolve_argv(spec: ServiceSpec) -> list[str]:
        if not spec.argv:
            raise PlacementError(f"could not start {unit_name(spec.name)}: the command is empty")
        program = spec.argv[0]
        if os.path.isabs(program):
            return list(spec.argv)  # systemd reports a missing absolute path itself (203/EXEC)
        found = shutil.which(program)
        if found is None:
            raise PlacementError(
                f"could not start {unit_name(spec.name)}: executable '{program}' not found in PATH; "
                "give an absolute path or install it"
            )
        return [found, *spec.argv[1:]]

    async def _prepare_name(self, unit: str) -> None:
        """Refuse a unit sparkd did not start or one already running; clear a failed one."""
        props = await self.bus.unit_properties(unit)
        if props is None:
            return
        if not self._is_ours(props):
            raise PlacementError(self._clash_message(unit, props))
        state = props.get("ActiveState")
        if state in ("active", "activating", "reloading", "deactivating"):
            raise PlacementError(
                f"could not start {unit}: it is already {state} (MainPID {props.get('MainPID')}); stop it first"
            )
        await self.bus.reset_failed_unit(unit)

    def _clash_message(self, unit: str, props: dict) -> str:
        origin = props.get("FragmentPath") or ("a transient unit" if props.get("Transient") else "unknown origin")
        return (
            f"could not start {unit}: a unit of that name exists that sparkd did not start "
            f"({origin}, slice {props.get('Slice') or '-'}, {props.get('ActiveState') or 'not loaded'}); "
            "rename the service in the policy or remove that unit"
        )

    async def start(self, spec: ServiceSpec) -> ServiceStatus:
        unit = unit_name(spec.name)
        argv = self._resolve_argv(spec)
        bus = await self._ensure_bus()
        await self._prepare_name(unit)
        # Tracked before the call: an engine that fails right after exec sends its signals just behind the call's
        # reply, and they are handled before this coroutine resumes (a unit added after them missed its failure).
        self._tracked.add(unit)
        try:
            job = await bus.start_transient_unit(unit, self._unit_properties(spec, argv))
        except BaseException as exc:  # a clash, a failed call, a cancel: no start of ours to report
            self._tracked.discard(unit)
            if isinstance(exc, BusCallError) and exc.dbus_name == "org.freedesktop.systemd1.UnitExists":
                props = await bus.load_unit_properties(unit) or {"FragmentPath": "a unit file"}
                raise PlacementError(self._clash_message(unit, props)) from exc
            raise
        result = await bus.wait_for_job(job, START_JOB_TIMEOUT_SECONDS)
        props = await bus.unit_properties(unit)
        if result != "done" and not _engine_ran(props):
            self._tracked.discard(unit)
            raise PlacementError(await self._clean_failed_start(unit, argv, result, props))
        # An engine that ran and exited at once fails the job or not, depending on who wins the
        # race; either way it is reported as a failed service, like one that fails later.
        return self._status_from(unit, props) if props else self._gone_status(unit)

    async def _clean_failed_start(self, unit: str, argv: list[str], job_result: str, props: dict | None) -> str:
        """Explain a failed start job and remove what it left; returns the error message."""
        props = props or {}
        code = props.get("ExecMainStatus")
        detail = EXEC_FAILURES.get(code) or (
            f"systemd could not set up the process (status {code}, see 'Process Exit Codes' in systemd.exec(5))"
            if props else "the unit is gone"
        )
        if props.get("ActiveState") not in (None, "inactive", "failed"):
            await self.bus.wait_for_job(await self.bus.stop_unit(unit), START_JOB_TIMEOUT_SECONDS)
        if props:
            try:
                await self.bus.reset_failed_unit(unit)
            except BusCallError as exc:  # already unloaded: nothing is left behind
                if exc.dbus_name != "org.freedesktop.systemd1.NoSuchUnit":
                    raise
        return f"could not start {unit}: start job {job_result}: {detail} (command: {' '.join(argv)})"

    # --- stop -------------------------------------------------------------------------------

    async def stop(self, name: str, timeout_seconds: float) -> ServiceStatus:
        """StopUnit (SIGTERM to the whole cgroup, systemd's TimeoutStopUSec applies too); if the
        job is not done after timeout_seconds, SIGKILL the cgroup and wait for it."""
        unit = unit_name(name)
        bus = await self._ensure_bus()
        props = await bus.unit_properties(unit)
        if props is not None and not self._is_ours(props):
            raise PlacementError(self._clash_message(unit, props).replace("could not start", "could not stop"))
        if props is not None and props.get("ActiveState") not in ("inactive", "failed"):
            job = await bus.stop_unit(unit)
            try:
                await bus.wait_for_job(job, timeout_seconds)
            except PlacementError:
                log.warning("%s did not stop within %s s, sending SIGKILL to its cgroup", unit, timeout_seconds)
                await bus.call(f"kill unit {unit}", "KillUnit", "ssi", [unit, "all", 9])
                await bus.wait_for_job(job, KILL_GRACE_SECONDS)
        props = await bus.unit_properties(unit)
        return self._status_from(unit, props) if props else self._gone_status(unit)
