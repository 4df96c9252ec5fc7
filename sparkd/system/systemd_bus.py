"""A small client for systemd's manager over the system D-Bus (dbus-fast, low-level messages).

Only what sparkd needs: transient units, stop/reset/disable, unit properties, GetUnitByPID, and
the JobRemoved / PropertiesChanged signals. Every D-Bus failure becomes a PlacementError that
says what could not be done and why.
"""

from __future__ import annotations

import asyncio
import os
import string
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from sparkd.errors import PlacementError

STANDARD_SYSTEM_BUS_ADDRESS = "unix:path=/run/dbus/system_bus_socket"
SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
UNIT_PATH_PREFIX = "/org/freedesktop/systemd1/unit/"
PROPERTIES = "org.freedesktop.DBus.Properties"
# Unit-type interfaces whose properties unit_properties() merges with org.freedesktop.systemd1.Unit.
_TYPE_INTERFACES = {"service": "Service", "slice": "Slice", "scope": "Scope", "socket": "Socket"}
# JobRemoved results kept for jobs nobody waits for yet: a job can finish before its caller
# resumes from the StartUnit reply, so results are remembered briefly.
_FINISHED_JOBS_KEPT = 256
CONNECT_TIMEOUT_SECONDS = 5.0


def default_system_bus_address(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("DBUS_SYSTEM_BUS_ADDRESS") or STANDARD_SYSTEM_BUS_ADDRESS


def unit_object_path(unit: str) -> str:
    """systemd's object path for a unit: every byte outside [A-Za-z0-9] becomes _XX."""
    ok = set(string.ascii_letters + string.digits)
    escaped = "".join(
        ch if ch in ok and not (i == 0 and ch.isdigit()) else f"_{ord(ch):02x}" for i, ch in enumerate(unit)
    )
    return UNIT_PATH_PREFIX + escaped


def unit_from_object_path(path: str) -> str | None:
    if not path.startswith(UNIT_PATH_PREFIX):
        return None
    escaped, out, i = path[len(UNIT_PATH_PREFIX) :], [], 0
    while i < len(escaped):
        if escaped[i] == "_" and i + 3 <= len(escaped):
            out.append(chr(int(escaped[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(escaped[i])
            i += 1
    return "".join(out)


class BusCallError(PlacementError):
    """A D-Bus method call returned an error; dbus_name is e.g. org.freedesktop.systemd1.NoSuchUnit."""

    def __init__(self, message: str, dbus_name: str):
        super().__init__(message)
        self.dbus_name = dbus_name


@dataclass(frozen=True)
class UnitSignal:
    """One systemd signal: JobRemoved (unit, job path, result) or PropertiesChanged (unit, values)."""

    member: str  # "JobRemoved" | "PropertiesChanged"
    unit: str | None
    path: str  # the job's path for JobRemoved, the unit's object path for PropertiesChanged
    interface: str = ""  # PropertiesChanged: the interface whose properties changed
    values: dict = field(default_factory=dict)  # JobRemoved: {"result": ...}; else the changes


SignalCallback = Callable[[UnitSignal], None]


def unwrap(value):
    """Plain Python values from dbus-fast Variants (recursively)."""
    if isinstance(value, Variant):
        return unwrap(value.value)
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    if isinstance(value, dict):
        return {k: unwrap(v) for k, v in value.items()}
    return value


class SystemdBus:
    def __init__(self, address: str | None = None):
        self.address = address or default_system_bus_address()
        self._bus: MessageBus | None = None
        self._listeners: list[SignalCallback] = []
        self._job_waiters: dict[str, asyncio.Future] = {}
        self._finished_jobs: OrderedDict[str, str] = OrderedDict()
        self._subscribed = False

    async def connect(self) -> SystemdBus:
        bus = MessageBus(bus_address=self.address, bus_type=BusType.SYSTEM)
        try:
            await asyncio.wait_for(bus.connect(), CONNECT_TIMEOUT_SECONDS)
        except Exception as exc:
            raise PlacementError(
                f"could not connect to the system bus at {self.address}: {exc or type(exc).__name__}; "
                "is D-Bus running?"
            ) from exc
        bus.add_message_handler(self._on_message)
        self._bus = bus
        return self

    async def close(self) -> None:
        if self._bus is not None:
            self._bus.disconnect()
            self._bus = None
        for waiter in self._job_waiters.values():
            if not waiter.done():
                waiter.set_exception(PlacementError(f"could not wait for a job: bus {self.address} closed"))
        self._job_waiters.clear()

    async def call(self, verb: str, member: str, signature: str = "", body: list | None = None,
                   path: str = MANAGER_PATH, interface: str = MANAGER, destination: str = SYSTEMD):  # fmt: skip
        """One method call (to systemd unless told); `verb` completes "could not <verb>: <cause>"."""
        if self._bus is None:
            raise PlacementError(f"could not {verb}: not connected to the system bus at {self.address}")
        msg = Message(destination=destination, path=path, interface=interface, member=member,
                      signature=signature, body=body or [])  # fmt: skip
        try:
            reply = await self._bus.call(msg)
        except Exception as exc:
            raise PlacementError(f"could not {verb}: lost the system bus at {self.address}: {exc}") from exc
        if reply.message_type == MessageType.ERROR:
            text = reply.body[0] if reply.body else ""
            raise BusCallError(f"could not {verb}: {text} ({reply.error_name})", reply.error_name or "")
        return unwrap(reply.body[0]) if len(reply.body) == 1 else unwrap(reply.body)

    # --- signals -----------------------------------------------------------------------------

    async def subscribe(self, callback: SignalCallback | None = None) -> None:
        """Ask systemd for unit signals and deliver each as a UnitSignal to callback."""
        if callback is not None:
            self._listeners.append(callback)
        if self._subscribed:
            return
        rules = [
            f"type='signal',sender='{SYSTEMD}',interface='{MANAGER}',member='JobRemoved'",
            f"type='signal',sender='{SYSTEMD}',interface='{PROPERTIES}',member='PropertiesChanged',"
            f"path_namespace='{UNIT_PATH_PREFIX.rstrip('/')}'",
        ]
        for rule in rules:
            await self.call("subscribe to systemd signals", "AddMatch", "s", [rule], path="/org/freedesktop/DBus",
                            interface="org.freedesktop.DBus", destination="org.freedesktop.DBus")  # fmt: skip
        await self.call("subscribe to systemd signals", "Subscribe")
        self._subscribed = True

    def unsubscribe(self, callback: SignalCallback) -> None:
        if callback in self._listeners:
            self._listeners.remove(callback)

    def _on_message(self, msg: Message) -> None:
        if msg.message_type != MessageType.SIGNAL:
            return None
        if msg.member == "JobRemoved" and msg.interface == MANAGER:
            _job_id, job_path, unit, result = msg.body
            self._job_finished(job_path, result)
            signal = UnitSignal("JobRemoved", unit, job_path, values={"result": result})
        elif msg.member == "PropertiesChanged" and msg.interface == PROPERTIES:
            interface, changed, _invalidated = msg.body
            signal = UnitSignal("PropertiesChanged", unit_from_object_path(msg.path), msg.path,
                                interface, unwrap(changed))  # fmt: skip
        else:
            return None
        for listener in list(self._listeners):
            listener(signal)
        return None

    def _job_finished(self, job_path: str, result: str) -> None:
        waiter = self._job_waiters.pop(job_path, None)
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(result)
            return
        self._finished_jobs[job_path] = result
        while len(self._finished_jobs) > _FINISHED_JOBS_KEPT:
            self._finished_jobs.popitem(last=False)

    async def wait_for_job(self, job_path: str, timeout_seconds: float) -> str:
        """Result of a job (done | canceled | timeout | failed | dependency | skipped)."""
        if job_path in self._finished_jobs:
            return self._finished_jobs.pop(job_path)
        waiter = asyncio.get_running_loop().create_future()
        self._job_waiters[job_path] = waiter
        try:
            return await asyncio.wait_for(waiter, timeout_seconds)
        except TimeoutError as exc:
            raise PlacementError(f"could not finish job {job_path}: no result after {timeout_seconds} s") from exc
        finally:
            self._job_waiters.pop(job_path, None)

    # --- units -------------------------------------------------------------------------------

    async def start_transient_unit(self, name: str, properties: list[tuple[str, str, object]],
                                   mode: str = "fail") -> str:  # fmt: skip
        """StartTransientUnit; properties are (name, D-Bus signature, value). Returns the job path.

        Call subscribe() first to be able to wait for the job.
        """
        props = [[key, Variant(sig, value)] for key, sig, value in properties]
        return await self.call(f"start transient unit {name}", "StartTransientUnit", "ssa(sv)a(sa(sv))",
                               [name, mode, props, []])  # fmt: skip

    async def stop_unit(self, name: str, mode: str = "replace") -> str:
        return await self.call(f"stop unit {name}", "StopUnit", "ss", [name, mode])

    async def reset_failed_unit(self, name: str) -> None:
        await self.call(f"reset failed unit {name}", "ResetFailedUnit", "s", [name])

    async def unit_properties(self, name: str) -> dict | None:
        """Properties of a loaded unit (Unit plus its type's interface), None when not loaded."""
        try:
            path = await self.call(f"get unit {name}", "GetUnit", "s", [name])
        except BusCallError as exc:
            if exc.dbus_name == "org.freedesktop.systemd1.NoSuchUnit":
                return None
            raise
        return await self._properties_at(name, path)

    async def load_unit_properties(self, name: str) -> dict | None:
        """Like unit_properties, but loads the unit from its unit file first (LoadUnit)."""
        path = await self.call(f"load unit {name}", "LoadUnit", "s", [name])
        return await self._properties_at(name, path)

    async def _properties_at(self, name: str, path: str) -> dict | None:
        interfaces = ["org.freedesktop.systemd1.Unit"]
        kind = _TYPE_INTERFACES.get(name.rsplit(".", 1)[-1])
        if kind:
            interfaces.append(f"org.freedesktop.systemd1.{kind}")
        props: dict = {}
        try:
            for interface in interfaces:
                props.update(await self.call(f"read properties of unit {name}", "GetAll", "s", [interface],
                                             path=path, interface=PROPERTIES))  # fmt: skip
        except BusCallError as exc:
            if exc.dbus_name in ("org.freedesktop.DBus.Error.UnknownObject", "org.freedesktop.systemd1.NoSuchUnit"):
                return None  # unloaded (garbage-collected) between the calls
            raise
        return props

    async def unit_by_pid(self, pid: int) -> str | None:
        """Name of the unit a process belongs to, None when systemd knows no unit for it."""
        try:
            path = await self.call(f"find the unit of pid {pid}", "GetUnitByPID", "u", [pid])
        except BusCallError as exc:
            if exc.dbus_name in ("org.freedesktop.systemd1.NoUnitForPID", "org.freedesktop.systemd1.NoSuchProcess"):
                return None
            raise
        return await self.call(f"read the unit name of pid {pid}", "Get", "ss", ["org.freedesktop.systemd1.Unit", "Id"],
                               path=path, interface=PROPERTIES)  # fmt: skip

    async def list_units(self, patterns: list[str], states: list[str] | None = None) -> list[dict]:
        """Loaded units matching glob patterns (ListUnitsByPatterns)."""
        rows = await self.call("list units", "ListUnitsByPatterns", "asas", [states or [], patterns])
        keys = ("name", "description", "load_state", "active_state", "sub_state", "following", "path")
        return [dict(zip(keys, row[:7])) for row in rows]

    async def stop_and_disable(self, unit: str, timeout_seconds: float = 90.0) -> dict:
        """Stop a unit and disable its unit files so it does not come back at boot.

        The unit's own stop logic runs (its KillSignal, SIGTERM by default; a SIGKILL only after
        its TimeoutStopSec): a killed ollama runner keeps its GPU memory, so sparkd never sends
        SIGKILL to a competitor itself.

        Returns {"unit", "stop_result", "disabled": [paths removed], "note"}. A transient unit
        has no unit files: disabling is a no-op, reported in "note".
        """
        props = await self.unit_properties(unit)
        await self.subscribe()
        stop_result = "not-loaded"
        if props is not None and props.get("ActiveState") not in ("inactive", "failed"):
            job = await self.stop_unit(unit)
            stop_result = await self.wait_for_job(job, timeout_seconds)
            if stop_result != "done":
                raise PlacementError(f"could not stop unit {unit}: stop job ended with '{stop_result}'")
        elif props is not None:
            stop_result = "already-stopped"
        disabled, note = await self._disable(unit, props)
        return {"unit": unit, "stop_result": stop_result, "disabled": disabled, "note": note}

    async def _disable(self, unit: str, props: dict | None) -> tuple[list[str], str]:
        if props is not None and props.get("Transient"):
            return [], "transient unit: no unit files to disable"
        try:
            changes = await self.call(f"disable unit {unit}", "DisableUnitFiles", "asb", [[unit], False])
        except BusCallError as exc:
            if exc.dbus_name == "org.freedesktop.systemd1.NoSuchUnit":
                return [], "no unit file to disable"
            raise
        removed = [path for kind, path, _target in changes if kind == "unlink"]
        if changes:
            await self.call(f"reload systemd after disabling {unit}", "Reload")
        return removed, "disabled" if removed else "was not enabled"
