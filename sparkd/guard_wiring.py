"""Connects the start guards to the chosen placement: with systemd, competitor units are stopped
and GPU processes named by their unit over the placement's own bus connection; with cgroupfs
there is no unit manager and the guards say so.
"""

from __future__ import annotations

from .errors import PlacementError
from .guards import GuardContext
from .placement.base import Placement
from .system.systemd_bus import SystemdBus

# A competitor (ollama) gets systemd's own stop logic, SIGTERM first; its runner can take a while
# to release GPU memory, so allow systemd's default stop timeout and a little more.
COMPETITOR_STOP_TIMEOUT_SECONDS = 100.0
_ACTIVE = ("active", "activating", "reloading", "deactivating")


class BusUnitManager:
    """The guards' UnitManager over a SystemdBus."""

    def __init__(self, bus: SystemdBus, stop_timeout_seconds: float = COMPETITOR_STOP_TIMEOUT_SECONDS):
        self._bus = bus
        self._stop_timeout_seconds = stop_timeout_seconds

    async def unit_active(self, unit: str) -> bool:
        props = await self._bus.unit_properties(unit)
        return props is not None and props.get("ActiveState") in _ACTIVE

    async def stop_and_disable(self, unit: str) -> None:
        await self._bus.stop_and_disable(unit, self._stop_timeout_seconds)

    async def stop_unit(self, unit: str) -> None:
        await self._bus.subscribe()
        job = await self._bus.stop_unit(unit)
        result = await self._bus.wait_for_job(job, self._stop_timeout_seconds)
        if result != "done":
            raise PlacementError(f"could not stop unit {unit}: stop job ended with '{result}'")


def guard_context(placement: Placement) -> GuardContext:
    bus = getattr(placement, "bus", None)
    if placement.name == "systemd" and isinstance(bus, SystemdBus):
        return GuardContext(unit_manager=BusUnitManager(bus), unit_of=bus.unit_by_pid)
    return GuardContext(no_unit_manager_reason=f"placement is {placement.name}: no systemd to stop competitor units")
