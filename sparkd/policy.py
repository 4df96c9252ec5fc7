"""The policy file: YAML -> validated pydantic models -> the values every component is built from.

Errors name the file, the key path, what was expected and what was found; unknown keys get a
did-you-mean. Sizes are resolved to bytes once, here (percentages need the physical memory size,
passed in by the caller so nothing deep inside reads the machine).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .errors import PolicyError
from .sizes import format_size, parse_size

DEFAULT_POLICY_PATH = Path("/etc/sparkd/policy.yaml")
_SERVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|min|m|h)?\s*$")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, None: 1, "min": 60, "m": 60, "h": 3600}


def parse_duration(value: Any) -> float:
    """Seconds from 30, 2.5, '30s', '500ms', '2min'."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 30, 30s or 500ms, found {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a duration cannot be negative, found {value}")
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"expected a duration such as 30, 30s or 500ms, found {value!r}")
    return float(m.group(1)) * _DURATION_SECONDS[m.group(2)]


def _size(value: Any, info: ValidationInfo) -> int:
    total = (info.context or {}).get("total_memory_bytes")
    return parse_size(value, total_bytes=total)


def read_api_key(path: Path) -> str:
    """The key in an api_key_file, stripped: read at policy load, by the watchers when they act
    and by sparkctl bench, with one error for all three."""
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise PolicyError(f"could not read API key file {path}: {exc.strerror or exc}; create it (readable by "
                          "sparkd and the engine) or remove the key") from None
    except UnicodeDecodeError:
        raise PolicyError(f"could not read API key file {path}: not UTF-8 text") from None
    if not key:
        raise PolicyError(f"could not use API key file {path}: the file is empty")
    return key


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DaemonPolicy(_Strict):
    placement: Literal["auto", "systemd", "cgroupfs"] = "auto"
    slice: str = "sparkd.slice"
    # None: the cgroup2 mount found in /proc/self/mountinfo (/sys/fs/cgroup, or
    # /sys/fs/cgroup/unified on hybrid v1/v2 hosts).
    cgroup_root: Path | None = None
    state_dir: Path = Path("/var/lib/sparkd")
    control_socket: Path = Path("/run/sparkd/control.sock")
    socket_group: str | None = None
    metrics_listen: str = "127.0.0.1:9464"
    # What `engine: embedded` runs: the installed console script, or a path (tests, venvs).
    engine_executable: str = "sparkd-engine"
    # Engines outlive sparkd by default: a supervisor restart must never cost a loaded model.
    stop_services_on_exit: bool = False

    @field_validator("slice")
    @classmethod
    def _slice_name(cls, v: str) -> str:
        if not v.endswith(".slice") or "/" in v:
            raise ValueError(f"expected a systemd slice name ending in .slice, found {v!r}")
        return v


class EmbeddedEngine(_Strict):
    model: Path
    listen: str = "127.0.0.1:7777"
    ctx: int | None = Field(default=None, gt=0)
    alias: str | None = None
    # The engine's API key, read from this file by the engine (--api-key-file: never on argv,
    # where ps shows it) and by sparkd's watchers (shrink_cache's Authorization header).
    api_key_file: Path | None = None
    extra_args: list[str] = []

    @field_validator("api_key_file")
    @classmethod
    def _key_readable(cls, v: Path | None) -> Path | None:
        if v is not None:
            try:
                read_api_key(v)
            except PolicyError as exc:
                raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _one_key_source(self) -> "EmbeddedEngine":
        given = [a for a in self.extra_args if a.split("=", 1)[0] in ("--api-key", "--api-key-file")]
        if self.api_key_file is not None and given:
            raise ValueError(f"api_key_file and {given[0].split('=', 1)[0]} in extra_args both set the API key; "
                             "keep api_key_file (the watchers need it)")
        return self


class EngineSpec(_Strict):
    embedded: EmbeddedEngine | None = None
    command: list[str] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "EngineSpec":
        if (self.embedded is None) == (self.command is None):
            raise ValueError("expected exactly one of 'embedded' or 'command'")
        if self.command is not None and (not self.command or not self.command[0]):
            raise ValueError("expected 'command' to be a non-empty argv list")
        return self


class ServicePolicy(_Strict):
    engine: EngineSpec
    memory_max: int
    # Where the kernel starts throttling (reclaim, then stalls) before memory_max kills: the room
    # between the two is where the pressure watchers see trouble and can shrink the engine's cache.
    memory_high: int | None = None
    swap_max: int = 0
    oom_policy: Literal["stop", "continue", "kill"] = "stop"
    restart: Literal["no", "on-failure", "always"] = "no"
    cpu_weight: int | None = Field(default=None, ge=1, le=10000)
    environment: dict[str, str] = {}
    working_directory: Path | None = None
    user: str | None = None
    autostart: bool = False
    stop_timeout: float = 30.0

    _sizes = field_validator("memory_max", "memory_high", "swap_max", mode="before")(_size)
    _durations = field_validator("stop_timeout", mode="before")(lambda v: parse_duration(v))

    @field_validator("memory_max")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("memory_max must be larger than 0")
        return v

    @field_validator("memory_high")
    @classmethod
    def _high_within_max(cls, v: int | None, info: ValidationInfo) -> int | None:
        limit = info.data.get("memory_max")  # absent when memory_max itself was invalid
        if v is None or limit is None:
            return v
        if v <= 0:
            raise ValueError("memory_high must be larger than 0")
        if v > limit:
            raise ValueError(f"memory_high {format_size(v)} ({v} B) is above memory_max {format_size(limit)} "
                             f"({limit} B): the kernel throttles at memory_high before memory_max kills, so it "
                             "must not be larger; lower memory_high or raise memory_max")
        return v


class Competitor(_Strict):
    unit: str | None = None
    process: str | None = None
    action: Literal["stop_and_disable", "stop", "terminate", "refuse", "ignore"] = "stop_and_disable"
    # SIGTERM first, always; SIGKILL only when the policy asks (a killed ollama runner keeps its
    # GPU memory, so the default is to refuse rather than kill).
    term_timeout: float = 10.0
    kill_after_timeout: bool = False

    _durations = field_validator("term_timeout", mode="before")(lambda v: parse_duration(v))

    @model_validator(mode="after")
    def _exactly_one(self) -> "Competitor":
        if (self.unit is None) == (self.process is None):
            raise ValueError("expected exactly one of 'unit' or 'process'")
        if self.process is not None and self.action == "stop_and_disable":
            raise ValueError("action 'stop_and_disable' needs a 'unit'; use 'terminate' for a process")
        return self


class GuardsPolicy(_Strict):
    gpu_busy_mib: int = Field(default=1024, ge=0)
    gpu_ignore: list[str] = []
    reserve: int = 16 << 30
    competitors: list[Competitor] = [Competitor(unit="ollama.service", action="stop_and_disable")]

    _sizes = field_validator("reserve", mode="before")(_size)


# --- watchers (sparkd/watch): detectors -> rules -> actions -----------------------------------

WatchAction = Literal["warn", "shrink_cache", "stop", "refuse_starts", "evict_competitors"]
_DURATION_FIELDS = ("stall", "window", "duration", "clear_below", "clear_for")


def _action_list(value: Any) -> Any:
    """`action: stop` or `action: [stop, refuse_starts]`."""
    return [value] if isinstance(value, str) else value


class _WatchRule(_Strict):
    name: str
    action: list[WatchAction]
    dry_run: bool = False  # log "would have ..." instead of acting
    # No action of this rule again for this long after one: the system needs time to react
    # (systemd-oomd's post-action delay).
    cooldown: float = 30.0
    budget: int | None = None  # shrink_cache: the expert cache budget to ask the engine for

    _actions = field_validator("action", mode="before")(_action_list)
    _cooldown = field_validator("cooldown", mode="before")(lambda v: parse_duration(v))
    _budget = field_validator("budget", mode="before")(lambda v, info: None if v is None else _size(v, info))

    @field_validator("action")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("expected at least one action (warn, shrink_cache, stop, refuse_starts, evict_competitors)")
        return v

    @model_validator(mode="after")
    def _budget_for_shrink(self):
        if "shrink_cache" in self.action and not self.budget:
            raise ValueError("action shrink_cache needs 'budget' (the smaller expert cache size, e.g. 8G)")
        return self


class PressureRule(_WatchRule):
    """psi: the service cgroup's memory.pressure; psi_system: /proc/pressure/memory;
    memory_events: an increment of a memory.events counter, or with `rate` the counter rising at
    least `rate` times a second over `window` (a level rule: duration, clear_for, grow-back);
    mem_available: MemAvailable below `below` (default guards.reserve)."""

    detector: Literal["psi", "psi_system", "memory_events", "mem_available"] = "psi"
    kind: Literal["some", "full"] = "some"
    stall: float | None = None  # psi: stalled time within window that counts as pressure
    window: float = 1.0
    duration: float = 0.0  # the condition must hold this long before the action
    clear_below: float | None = None  # psi: stall within window under which pressure has cleared (default stall/2)
    clear_for: float | None = None  # how long it must stay clear (default: window)
    counter: Literal["oom", "oom_kill", "max", "high"] | None = None
    # memory_events: increments per second over `window` that count as exceeded; clears below half
    rate: float | None = Field(default=None, gt=0)
    below: int | None = None

    _durations = field_validator(*_DURATION_FIELDS, mode="before")(lambda v: None if v is None else parse_duration(v))
    _below = field_validator("below", mode="before")(lambda v, info: None if v is None else _size(v, info))

    @model_validator(mode="after")
    def _fields_for_detector(self) -> "PressureRule":
        if self.detector in ("psi", "psi_system"):
            if self.stall is None:
                raise ValueError(f"detector {self.detector} needs 'stall' (e.g. 150ms)")
            if not 0 < self.stall <= self.window:
                raise ValueError(f"'stall' must be above 0 and at most 'window' ({self.window:g} s), found {self.stall:g} s")
            if not 0.5 <= self.window <= 10:
                raise ValueError(f"'window' must be between 500ms and 10s (the kernel's PSI limits), found {self.window:g} s")
        elif self.detector == "memory_events" and self.counter is None:
            raise ValueError("detector memory_events needs 'counter' (oom, oom_kill, max or high)")
        if self.rate is not None:
            self._check_rate()
        return self

    def _check_rate(self) -> None:
        if self.detector != "memory_events":
            raise ValueError(f"'rate' only goes with detector memory_events, found detector {self.detector}")
        if not 0.5 <= self.window <= 60:
            raise ValueError(f"'window' of a rate rule must be between 500ms and 60s, found {self.window:g} s")
        if self.clear_below is not None:
            raise ValueError("'clear_below' is a PSI stall; a rate rule clears below half its 'rate'")


class PressurePolicy(_Strict):
    # Detectors read their files at least this often (PSI totals, MemAvailable, memory.events
    # where the kernel cannot notify): one second matches the shortest PSI window sparkd uses.
    sample_interval: float = 1.0
    rules: list[PressureRule] = []

    _durations = field_validator("sample_interval", mode="before")(lambda v: parse_duration(v))


class KernelLogRule(_WatchRule):
    """no_memory: an NVRM line with NV_ERR_NO_MEMORY or "Out of memory"; xid_node / xid_application:
    an Xid of that class (from /dev/kmsg or NVML); xid: any Xid, or those listed in `xids`."""

    match: Literal["no_memory", "xid_node", "xid_application", "xid"]
    xids: list[int] | None = None

    @model_validator(mode="after")
    def _xids_only_for_xid(self) -> "KernelLogRule":
        if self.xids is not None and self.match != "xid":
            raise ValueError(f"'xids' only goes with match: xid, found match: {self.match}")
        return self


class KernelLogPolicy(_Strict):
    kmsg_path: Path = Path("/dev/kmsg")
    nvml_xid: bool = True  # also take Xid events from NVML where it exists
    rules: list[KernelLogRule] = []


class EventLogPolicy(_Strict):
    max_bytes: int = 8 << 20  # rotate events.jsonl at this size
    keep: int = Field(default=4, ge=1)  # rotated files kept (events.jsonl.1 ... .keep)

    _sizes = field_validator("max_bytes", mode="before")(_size)


class Policy(_Strict):
    daemon: DaemonPolicy = DaemonPolicy()
    services: dict[str, ServicePolicy] = {}
    guards: GuardsPolicy = GuardsPolicy()
    pressure: PressurePolicy = PressurePolicy()
    kernel_log: KernelLogPolicy = KernelLogPolicy()
    events: EventLogPolicy = EventLogPolicy()

    @field_validator("services")
    @classmethod
    def _names(cls, v: dict[str, ServicePolicy]) -> dict[str, ServicePolicy]:
        for name in v:
            if not _SERVICE_NAME.match(name):
                raise ValueError(
                    f"service name {name!r} must be letters, digits, '_', '.', '-' (it becomes the unit sparkd-{name}.service)"
                )
        return v


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class whose fields are valid at key path loc (for did-you-mean)."""
    model: Any = Policy
    for part in loc:
        if isinstance(model, type) and issubclass(model, BaseModel):
            field = model.model_fields.get(str(part))
            if field is None:
                return model
            ann = field.annotation
            args = getattr(ann, "__args__", ())
            candidates = [a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)]
            if candidates:
                model = candidates[0]
            elif args and isinstance(args[-1], type) and issubclass(args[-1], BaseModel):
                model = args[-1]  # dict[str, Model] / list[Model]
            else:
                model = None
        # dict keys and list indexes keep the current element model
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _describe(err: dict) -> str:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    path = ".".join(str(p) for p in loc) or "(top level)"
    found = err.get("input")
    if err["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        hint = ""
        if parent is not None:
            close = difflib.get_close_matches(str(loc[-1]), list(parent.model_fields), n=1)
            known = ", ".join(parent.model_fields)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {known})"
        return f"{path}: unknown key{hint}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{path}: {msg}; found {found!r}" if "found" not in msg else f"{path}: {msg}"


def parse_policy(data: Any, *, source: str, total_memory_bytes: int) -> Policy:
    """Validate already-parsed YAML. source names the file in errors."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(f"could not load policy {source}: expected a mapping at the top level, found {type(data).__name__}")
    try:
        return Policy.model_validate(data, context={"total_memory_bytes": total_memory_bytes})
    except ValidationError as exc:
        lines = "\n".join(f"  {_describe(e)}" for e in exc.errors())
        raise PolicyError(f"could not load policy {source}: {exc.error_count()} error(s)\n{lines}") from None


def load_policy(path: Path, *, total_memory_bytes: int) -> Policy:
    """Read and validate a policy file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PolicyError(f"could not read policy {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError(f"could not parse policy {path}{where}: {problem}") from None
    return parse_policy(data, source=str(path), total_memory_bytes=total_memory_bytes)
