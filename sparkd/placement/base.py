"""The one small interface every placement backend implements.

A backend turns a ServiceSpec into a running, memory-isolated service (a transient systemd unit or
a cgroup written directly), reports its state as ServiceStatus, stops it, and finds the services a
previous sparkd started (re-adoption after a restart: never kill, never duplicate).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import asdict, dataclass, field


def unit_name(service: str) -> str:
    """systemd unit (and cgroup directory) name of a sparkd service."""
    return f"sparkd-{service}.service"


@dataclass(frozen=True)
class ServiceSpec:
    """Everything a backend needs to place one service; built from the policy once."""

    name: str
    argv: list[str]
    memory_max_bytes: int
    memory_high_bytes: int | None = None  # None: no throttling threshold (memory.high stays max)
    swap_max_bytes: int = 0
    oom_policy: str = "stop"  # stop | continue | kill (systemd's OOMPolicy=)
    restart: str = "no"
    cpu_weight: int | None = None
    environment: dict[str, str] = field(default_factory=dict)
    working_directory: str | None = None
    user: str | None = None
    stop_timeout_seconds: float = 30.0
    description: str = ""


@dataclass
class ServiceStatus:
    """What a backend knows about one service, in systemd's vocabulary for both backends.

    active_state: active | activating | deactivating | inactive | failed
    result: success | exit-code | signal | oom-kill | timeout | core-dump | unknown
    """

    name: str
    backend: str
    unit: str
    cgroup: str | None = None  # absolute path under the cgroup2 mount, when known
    active_state: str = "inactive"
    sub_state: str = "dead"
    result: str = "success"
    exec_main_status: int | None = None
    main_pid: int | None = None
    memory_enforced: bool = False
    memory_max_bytes: int | None = None
    memory_high_bytes: int | None = None
    message: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


# Called by a backend whenever a service it placed changes state (exit, OOM kill, stop).
StatusCallback = Callable[[ServiceStatus], None]


class Placement(abc.ABC):
    """A placement backend. All methods are coroutines; errors are PlacementError."""

    name: str  # "systemd" | "cgroupfs"

    @property
    @abc.abstractmethod
    def memory_enforced(self) -> bool:
        """True when memory.max is really enforced (the memory controller is available)."""

    @property
    def why_not_enforced(self) -> str:
        """Operator-facing reason when memory_enforced is False."""
        return ""

    @abc.abstractmethod
    async def start(self, spec: ServiceSpec) -> ServiceStatus:
        """Place and start; on failure leave no unit, cgroup or process behind."""

    @abc.abstractmethod
    async def stop(self, name: str, timeout_seconds: float) -> ServiceStatus:
        """Stop cleanly (SIGTERM, then kill after timeout) and return the final status."""

    @abc.abstractmethod
    async def status(self, name: str) -> ServiceStatus | None:
        """Current status, or None when the backend has no such service."""

    @abc.abstractmethod
    async def adopt(self) -> list[ServiceStatus]:
        """Services this backend placed earlier that still exist (after a sparkd restart)."""

    async def close(self) -> None:
        """Release connections; never stops services."""
