"""The watchers: detectors feed samples to the policy's rules, rules decide, actions act, and every
detection and decision is an event (sparkd/watch/events.py).

System-wide detectors (/proc/pressure/memory, MemAvailable, /dev/kmsg, NVML) start with the
daemon; per-service detectors (memory.pressure, memory.events) start when a service is seen
running (started or adopted) and stop with it. A system-wide rule acts on every running service
(refuse_starts then holds every start).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..metrics.counters import SparkdCounters
from ..policy import KernelLogRule, Policy, PressureRule
from ..sizes import format_size
from ..system.meminfo import DEFAULT_MEMINFO_PATH
from .actions import ACTIONS, ActionContext
from .detectors import DetectorHandle, DetectorSet
from .events import EventLog
from .holds import Holds
from .kmsg import DEFAULT_BOOT_ID_PATH, KmsgReader, KmsgRecord, read_boot_id
from .mem_available import AvailableSample, MemAvailableDetector
from .memory_events import CounterIncrement, EventsUnavailable, MemoryEventsDetector
from .nvml_xid import NvmlUnavailable, NvmlXidDetector
from .nvrm import NvrmFinding, classify, matches
from .psi import SYSTEM_PRESSURE_PATH, PressureGone, PsiDetector, PsiSample, TriggerSpec
from .rules import CLEAR, COOLDOWN, FIRE, Cooldown, CounterRate, LevelCondition, StallWindow

KMSG_CURSOR_FILE = "kmsg.cursor"
# MemAvailable must climb this much above the floor before the floor rule clears (hysteresis).
AVAILABLE_CLEAR_FACTOR = 1.1


class ServiceControl(ActionContext, Protocol):
    def running_services(self) -> dict[str, Path | None]:
        """Running services and their cgroup directories (None where unknown)."""

    def service_of_pid(self, pid: int) -> str | None: ...


class _LevelRule:
    def __init__(self, rule: PressureRule):
        self.window = CounterRate(rule.window) if rule.rate is not None else StallWindow(rule.window)
        clear_for = rule.clear_for if rule.clear_for is not None else rule.window
        self.condition = LevelCondition(rule.duration, clear_for, rule.cooldown)


OOM_COUNTERS = frozenset({"oom", "oom_kill", "oom_group_kill"})


def _outcome(result: str, dry_run: bool) -> str:
    """An action's result sentence as a bounded metric label."""
    if result.startswith("failed"):
        return "failed"
    if dry_run:
        return "dry_run"
    return "skipped" if result.startswith("skipped") else "done"


def _nvrm_bucket(finding: NvrmFinding) -> str:
    if finding.kind == "no_memory":
        return "out_of_memory"
    return finding.xid_class if finding.xid_class in ("application", "node") else "other"


class WatchManager:
    def __init__(self, policy: Policy, control: ServiceControl, events: EventLog, holds: Holds, *,
                 state_dir: Path, proc_pressure_path: str = SYSTEM_PRESSURE_PATH,
                 meminfo_path: Path = DEFAULT_MEMINFO_PATH, boot_id_path: Path = DEFAULT_BOOT_ID_PATH,
                 nvml: Any = None, clock: Callable[[], float] = time.monotonic,
                 counters: SparkdCounters | None = None):
        self.policy = policy
        self.counters = counters if counters is not None else SparkdCounters()
        self.control = control
        self.events = events
        self.holds = holds
        self._cursor_path = Path(state_dir) / KMSG_CURSOR_FILE
        self._proc_pressure_path = proc_pressure_path
        self._meminfo_path = Path(meminfo_path)
        self._boot_id_path = Path(boot_id_path)
        self._nvml = nvml
        self._clock = clock
        self._interval = policy.pressure.sample_interval
        self.detectors = DetectorSet(self._detector_ended, clock)
        self._actions = {name: cls(control) for name, cls in ACTIONS.items()}
        self._levels: dict[tuple[str, str | None], _LevelRule] = {}
        self._cooldowns: dict[tuple[str, str | None], Cooldown] = {}
        # per rule: a rule's grow-back waits for its shrink, but a stop never waits behind a
        # shrink stuck on an engine stalled by the very pressure being handled
        self._action_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task] = set()
        self._reconciler: asyncio.Task | None = None
        self._kmsg: KmsgReader | None = None

    def _rules(self, *detectors: str) -> list[PressureRule]:
        return [r for r in self.policy.pressure.rules if r.detector in detectors]

    # --- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.events.open()
        self.holds.load()
        self._start_system_detectors()
        self.sync_services()
        self._reconciler = asyncio.get_running_loop().create_task(self._reconcile_loop())

    async def close(self) -> None:
        if self._reconciler is not None:
            self._reconciler.cancel()
            await asyncio.gather(self._reconciler, return_exceptions=True)
        await self.detectors.stop_all()
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        self._save_cursor()
        self.events.close()

    def _start_system_detectors(self) -> None:
        specs = [self._trigger_spec(r) for r in self._rules("psi_system")]
        if specs:
            det = PsiDetector(self._proc_pressure_path, specs, lambda s: self._on_psi(None, s),
                              interval_seconds=self._interval, clock=self._clock)
            self.detectors.start("psi:system", det, det.run)
        if self._rules("mem_available"):
            det = MemAvailableDetector(self._on_available, meminfo_path=self._meminfo_path,
                                       interval_seconds=self._interval, clock=self._clock)
            self.detectors.start("mem_available", det, det.run)
        if self.policy.kernel_log.rules:
            self._start_kmsg()
            if self.policy.kernel_log.nvml_xid:
                det = NvmlXidDetector(lambda f: self._on_finding(f, "nvml_xid"), nvml=self._nvml)
                self.detectors.start("nvml_xid", det, det.run)

    def _start_kmsg(self) -> None:
        cursor = self._load_cursor()
        self._kmsg = KmsgReader(self._on_kmsg, self._on_overrun, path=self.policy.kernel_log.kmsg_path,
                                resume_after_seq=cursor)
        self.detectors.start("kmsg", self._kmsg, self._kmsg.run)

    def _load_cursor(self) -> int | None:
        """The last kmsg record an earlier sparkd read in this boot: resume after it."""
        try:
            data = json.loads(self._cursor_path.read_text())
        except (OSError, ValueError):
            return None
        if data.get("boot_id") != read_boot_id(self._boot_id_path) or not isinstance(data.get("seq"), int):
            return None
        return data["seq"]

    def _save_cursor(self) -> None:
        if self._kmsg is None or self._kmsg.last_seq is None:
            return
        data = {"boot_id": read_boot_id(self._boot_id_path), "seq": self._kmsg.last_seq}
        try:
            tmp = self._cursor_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.rename(self._cursor_path)
        except OSError:
            pass  # losing the cursor only means the next start reads from the end

    @staticmethod
    def _trigger_spec(rule: PressureRule) -> TriggerSpec:
        return TriggerSpec(rule.name, rule.kind, round(rule.stall * 1e6), round(rule.window * 1e6))

    def sync_services(self) -> None:
        """Start detectors of services now running, stop those of services that ended."""
        running = self.control.running_services()
        for name, cgroup in running.items():
            if cgroup is None:
                continue
            if self._rules("psi") and self.detectors.due_for_retry(f"psi:{name}"):
                specs = [self._trigger_spec(r) for r in self._rules("psi")]
                det = PsiDetector(str(cgroup / "memory.pressure"), specs, lambda s, n=name: self._on_psi(n, s),
                                  interval_seconds=self._interval, clock=self._clock)
                self.detectors.start(f"psi:{name}", det, det.run)
            if self._rules("memory_events") and self.detectors.due_for_retry(f"memory_events:{name}"):
                det = MemoryEventsDetector(str(cgroup / "memory.events"), lambda i, n=name: self._on_increment(n, i),
                                           on_sample=lambda t, c, n=name: self._on_events_sample(n, t, c),
                                           interval_seconds=self._interval, clock=self._clock)
                self.detectors.start(f"memory_events:{name}", det, det.run)
        for key in list(self.detectors.handles):
            kind, _, name = key.partition(":")
            if kind in ("psi", "memory_events") and name != "system" and name not in running:
                asyncio.get_running_loop().create_task(self.detectors.stop(key))
                for state_key in [k for k in self._levels if k[1] == name]:
                    del self._levels[state_key]

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                self.sync_services()
                if self.detectors.due_for_retry("kmsg") and self.policy.kernel_log.rules:
                    self._start_kmsg()
                self._save_cursor()
            except Exception as exc:  # the watchers must outlive one bad round
                self._event("watch_error", level="error", result=f"{type(exc).__name__}: {exc}")

    def _detector_ended(self, handle: DetectorHandle) -> None:
        exc = handle.extra.get("exception")
        if isinstance(exc, PressureGone):
            handle.state = "gone"
        elif isinstance(exc, (EventsUnavailable, NvmlUnavailable)):
            handle.state = "unavailable"
        level = "error" if handle.state == "failed" else "info"
        if handle.state == "failed":
            watcher, _, service = handle.key.partition("@")
            self.counters.watcher_error(watcher, service)
        self._event("detector_" + handle.state, level=level, detector=handle.key, result=handle.error)

    # --- events and actions -------------------------------------------------------------------

    def _event(self, type_: str, level: str = "info", **fields) -> dict:
        return self.events.append(level, type=type_, **fields)

    def _targets(self, service: str | None) -> list[str | None]:
        if service is not None:
            return [service]
        return sorted(self.control.running_services()) or [None]

    def _decide(self, rule: PressureRule | KernelLogRule, service: str | None, detector: str, values: dict,
                reason: str, *, revert: bool = False) -> None:
        verb = "cleared" if revert else "fired"
        self._event(verb, level="info" if revert else "warning", service=service, detector=detector, values=values,
                    rule=rule.name, action=rule.action, dry_run=rule.dry_run, result=reason)
        task = asyncio.get_running_loop().create_task(self._run_actions(rule, service, detector, reason, revert))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_actions(self, rule, service, detector, reason, revert) -> None:
        async with self._action_locks.setdefault(rule.name, asyncio.Lock()):
            for target in self._targets(service):
                for name in rule.action:
                    action = self._actions[name]
                    try:
                        if revert:
                            result = await action.revert(target, rule, rule.dry_run)
                            if result is None:
                                continue
                        else:
                            result = await action.apply(target, rule, reason, rule.dry_run)
                    except Exception as exc:  # an action failing must not take the watchers down
                        result = f"failed: {type(exc).__name__}: {exc}"
                    level = "error" if result.startswith("failed") else "warning"
                    self.counters.action(rule.name, name, _outcome(result, rule.dry_run))
                    self._event("reverted" if revert else "action", level=level, service=target, detector=detector, rule=rule.name,
                                action=name, dry_run=rule.dry_run, result=result)

    # --- detectors -> rules -------------------------------------------------------------------

    def _level(self, rule: PressureRule, service: str | None) -> _LevelRule:
        key = (rule.name, service)
        if key not in self._levels:
            self._levels[key] = _LevelRule(rule)
        return self._levels[key]

    def _apply_level(self, rule, service, detector, now, exceeded, cleared, values, reason) -> None:
        state = self._level(rule, service)
        crossing = state.condition.exceeded_since is None and not state.condition.active and exceeded
        outcome = state.condition.update(now, exceeded, cleared)
        if crossing:
            self._event("crossed", service=service, detector=detector, values=values, rule=rule.name, result=reason)
        if outcome == FIRE:
            self._decide(rule, service, detector, values, reason)
        elif outcome == CLEAR:
            self._decide(rule, service, detector, values, "condition cleared", revert=True)
        elif outcome == COOLDOWN:
            self._event("cooldown", service=service, detector=detector, values=values, rule=rule.name,
                        action=rule.action, result=f"not acting: within cooldown {rule.cooldown:g} s of the last action")

    def _on_psi(self, service: str | None, sample: PsiSample) -> None:
        detector = "psi_system" if service is None else "psi"
        for rule in self._rules(detector):
            stall = self._level(rule, service).window.add(sample.time, sample.total_us.get(rule.kind, 0))
            fired = rule.name in sample.fired
            exceeded = fired or (stall is not None and stall >= rule.stall)
            clear_level = rule.clear_below if rule.clear_below is not None else rule.stall / 2
            cleared = not fired and stall is not None and stall < clear_level
            values = {"kind": rule.kind, "stall_seconds": round(stall, 4) if stall is not None else None,
                      "window_seconds": rule.window, "threshold_seconds": rule.stall, "trigger_fired": fired,
                      "avg10": sample.avg10.get(rule.kind), "path": sample.path}
            reason = (f"{rule.kind} stall {values['stall_seconds']} s per {rule.window:g} s window "
                      f"(threshold {rule.stall:g} s) for {rule.duration:g} s")
            self._apply_level(rule, service, detector, sample.time, exceeded, cleared, values, reason)

    def _on_available(self, sample: AvailableSample) -> None:
        for rule in self._rules("mem_available"):
            floor = rule.below if rule.below is not None else self.policy.guards.reserve
            values = {"available_bytes": sample.available_bytes, "floor_bytes": floor}
            reason = f"MemAvailable {format_size(sample.available_bytes)} below {format_size(floor)}"
            self._apply_level(rule, None, "mem_available", sample.time, sample.available_bytes < floor,
                              sample.available_bytes >= floor * AVAILABLE_CLEAR_FACTOR, values, reason)

    def _on_increment(self, service: str, inc: CounterIncrement) -> None:
        values = {"counter": inc.counter, "before": inc.before, "after": inc.after, "path": inc.path}
        if inc.counter in OOM_COUNTERS:  # max/high rise constantly under pressure: only rules record those
            self._event("detected", service=service, detector="memory_events", values=values)
        for rule in self._rules("memory_events"):
            if rule.counter == inc.counter and rule.rate is None:
                self._edge(rule, service, "memory_events", inc.time, values,
                           f"memory.events {inc.counter} {inc.before} -> {inc.after}")

    def _on_events_sample(self, service: str, now: float, counters: dict[str, int]) -> None:
        """Rate rules: a memory.events counter rising `rate` times a second (memory.events `high`
        counts the throttling the kernel starts at memory.high, before PSI shows a stall)."""
        for rule in self._rules("memory_events"):
            if rule.rate is None:
                continue
            rate = self._level(rule, service).window.add(now, counters.get(rule.counter, 0))
            values = {"counter": rule.counter, "per_second": round(rate, 2) if rate is not None else None,
                      "window_seconds": rule.window, "threshold_per_second": rule.rate}
            reason = (f"memory.events {rule.counter} {values['per_second']}/s over {rule.window:g} s "
                      f"(threshold {rule.rate:g}/s) for {rule.duration:g} s")
            self._apply_level(rule, service, "memory_events", now, rate is not None and rate >= rule.rate,
                              rate is not None and rate < rule.rate / 2, values, reason)

    def _edge(self, rule, service, detector, now, values, reason) -> None:
        cooldown = self._cooldowns.setdefault((rule.name, service), Cooldown(rule.cooldown))
        if cooldown.allow(now):
            self._decide(rule, service, detector, values, reason)
        elif cooldown.first_refusal():
            self._event("cooldown", service=service, detector=detector, values=values, rule=rule.name,
                        action=rule.action, result=f"not acting: within cooldown {rule.cooldown:g} s of the last action")

    def _on_kmsg(self, record: KmsgRecord) -> None:
        finding = classify(record.text)
        if finding is not None:
            self._on_finding(finding, "kmsg", {"seq": record.seq, "usec": record.usec, "priority": record.priority})
            self._save_cursor()

    def _on_overrun(self, lost: int) -> None:
        self._event("kmsg_overrun", level="warning", detector="kmsg", values={"lost_records": lost},
                    result=f"fell behind the kernel log: {lost} record(s) lost; reading on")

    def _on_finding(self, finding: NvrmFinding, detector: str, extra: dict | None = None) -> None:
        values = {**finding.to_dict(), **(extra or {})}
        service = None
        if finding.xid_class == "application" and finding.pid is not None:
            service = self.control.service_of_pid(finding.pid)
        self._event("detected", level="warning", service=service, detector=detector, values=values)
        self.counters.nvrm_event(finding.xid, _nvrm_bucket(finding))
        for rule in self.policy.kernel_log.rules:
            if matches(finding, rule.match, rule.xids):
                what = f"Xid {finding.xid} ({finding.xid_class})" if finding.kind == "xid" else "NVRM out of memory"
                self._edge(rule, service, detector, self._clock(), values, f"{what}: {finding.text[:200]}")

    # --- status -------------------------------------------------------------------------------

    def health(self) -> dict:
        active = {f"{rule}@{svc or 'system'}": True for (rule, svc), st in self._levels.items() if st.condition.active}
        return {"detectors": self.detectors.health(), "active_rules": sorted(active), "holds": self.holds.holds,
                "event_log": str(self.events.path), "last_event_seq": self.events.last_seq}
