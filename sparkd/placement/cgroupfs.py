"""Placement by writing a cgroup v2 subtree directly, for hosts where PID 1 is not systemd.

Layout: CGROUP_ROOT/SLICE/sparkd-NAME.service, limits in memory.max, memory.swap.max,
memory.oom.group and cpu.weight. The service is started by cgroupfs_launcher.py, which joins
the cgroup before it forks the service and records the main process's exit into
STATE_DIR/cgroupfs/ (see that file for why). One monitor task per service polls: the launcher
(reaped with waitpid while sparkd is its parent), memory.events (an oom_kill stops the whole
service: systemd's OOMPolicy=stop) and cgroup.events (populated 0 ends a service sparkd
re-adopted after a restart). Services are never restarted (Restart=no).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field, replace

from sparkd.errors import PlacementError
from sparkd.placement.base import Placement, ServiceSpec, ServiceStatus, StatusCallback, unit_name
from sparkd.placement.cgroupfs_result import final_result
from sparkd.placement.cgroupfs_spawn import check_spec, kill_launcher, launch
from sparkd.system import cgroups

log = logging.getLogger(__name__)

# Launching is a fork and an exec; 10 s only trips on a wedged machine, never on a slow one.
LAUNCH_TIMEOUT_SECONDS = 10.0
# After cgroup.kill the kernel needs a moment to tear processes down (large RSS frees slowly).
KILL_WAIT_SECONDS = 10.0
# Polling memory.events / cgroup.events: an OOM reacts within this, a small cost per service.
POLL_INTERVAL_SECONDS = 0.2


@dataclass
class _Service:
    name: str
    cgroup: str
    status: ServiceStatus
    oom_policy: str = "stop"
    launcher: subprocess.Popen | None = None  # None after a sparkd restart (not our child)
    stop_requested: bool = False
    stop_timed_out: bool = False
    oom_kill_seen: bool = False
    done: asyncio.Future | None = None
    monitor: asyncio.Task | None = None
    notes: list[str] = field(default_factory=list)


class CgroupfsPlacement(Placement):
    name = "cgroupfs"

    def __init__(
        self,
        cgroup_root: str = "/sys/fs/cgroup",
        slice: str = "sparkd.slice",
        state_dir: str = "/var/lib/sparkd",
        on_change: StatusCallback | None = None,
        poll_interval_seconds: float = POLL_INTERVAL_SECONDS,
        mountinfo_path: str = cgroups.DEFAULT_MOUNTINFO,
        python: str = sys.executable,
        launch_timeout_seconds: float = LAUNCH_TIMEOUT_SECONDS,
    ):
        self.cgroup_root = os.path.normpath(str(cgroup_root))
        self.slice_path = os.path.join(self.cgroup_root, slice)
        self.state_dir = os.path.join(str(state_dir), "cgroupfs")
        self._on_change = on_change
        self._poll_seconds = poll_interval_seconds
        self._mountinfo_path = mountinfo_path
        self._python = python
        self._launch_timeout_seconds = launch_timeout_seconds
        self._services: dict[str, _Service] = {}

    # -- enforcement report ---------------------------------------------------------------------

    @property
    def memory_enforced(self) -> bool:
        return self._memory_problem() is None

    @property
    def why_not_enforced(self) -> str:
        return self._memory_problem() or ""

    def _memory_problem(self) -> str | None:
        try:
            available = cgroups.controllers(self._mount())
        except (OSError, PlacementError) as exc:
            return f"could not read the cgroup controllers for {self.cgroup_root}: {exc}"
        if "memory" in available:
            return None
        return (
            f"the memory controller is not available in {self._mount()} (cgroup.controllers: "
            f"{' '.join(sorted(available)) or 'none'}), so memory.max, memory.swap.max and "
            "memory.oom.group cannot be written: memory limits are NOT enforced and OOM kills "
            "are not detected. This is the hybrid cgroup v1/v2 layout; boot with "
            "systemd.unified_cgroup_hierarchy=1 (pure cgroup v2) to enforce them"
        )

    def _mount(self) -> str:
        """The cgroup2 mount that holds cgroup_root (the top for enabling controllers)."""
        try:
            with open(self._mountinfo_path) as f:
                mounts = cgroups.parse_mountinfo_cgroup2(f.read())
        except OSError as exc:
            raise PlacementError(f"could not read {self._mountinfo_path}: {exc.strerror}") from exc
        holding = [m for m in mounts if os.path.commonpath([m, self.cgroup_root]) == m]
        if not holding:
            raise PlacementError(
                f"could not use cgroup root {self.cgroup_root}: it is not inside a cgroup2 mount "
                f"(cgroup2 mounts: {', '.join(mounts) or 'none'}); set daemon.cgroup_root"
            )
        return max(holding, key=len)

    # -- start ----------------------------------------------------------------------------------

    async def start(self, spec: ServiceSpec) -> ServiceStatus:
        check_spec(spec)
        current = self._services.get(spec.name)
        if current is not None and not current.done.done():
            raise PlacementError(
                f"could not start {spec.name}: it is already running in {current.cgroup}; stop it first"
            )
        cgroup = os.path.join(self.slice_path, unit_name(spec.name))
        if os.path.isdir(cgroup) and cgroups.is_populated(cgroup):
            raise PlacementError(
                f"could not start {spec.name}: {cgroup} already has processes "
                "(a service sparkd has not adopted); adopt or stop it first"
            )
        self._prepare_state_dir(spec.name)
        created_slice = self._create_cgroup(spec.name, cgroup)
        launcher = None
        try:
            memory_enforced, notes = self._write_limits(spec, cgroup)
            launcher, main_pid = await launch(
                spec, cgroup, python=self._python, exit_record=self._exit_record(spec.name),
                log_path=self.log_path(spec.name), timeout_seconds=self._launch_timeout_seconds,
            )
            status = ServiceStatus(
                name=spec.name, backend=self.name, unit=unit_name(spec.name), cgroup=cgroup,
                active_state="active", sub_state="running", main_pid=main_pid,
                memory_enforced=memory_enforced, memory_max_bytes=spec.memory_max_bytes,
                memory_high_bytes=spec.memory_high_bytes,
                message="; ".join(notes),
            )
            svc = _Service(spec.name, cgroup, status, spec.oom_policy, launcher, notes=notes)
            self._save_state(svc, launcher.pid)
        except BaseException:
            if launcher is not None:
                kill_launcher(launcher, cgroup)
            self._discard_cgroup(cgroup, created_slice)
            raise
        self._track(svc, watch=True)
        return replace(status)

    def _prepare_state_dir(self, name: str) -> None:
        try:
            os.makedirs(self.state_dir, exist_ok=True)
            for path in (self._exit_record(name), self._state_file(name)):
                if os.path.exists(path):
                    os.unlink(path)  # from an earlier run of the same service
        except OSError as exc:
            raise PlacementError(
                f"could not prepare state directory {self.state_dir}: {exc.strerror}"
            ) from exc

    def _create_cgroup(self, name: str, cgroup: str) -> bool:
        """mkdir slice (if needed) and service; True when this call created the slice."""
        if not os.path.isfile(os.path.join(self.cgroup_root, "cgroup.controllers")):
            raise PlacementError(
                f"could not start {name}: cgroup root {self.cgroup_root} is not a cgroup v2 "
                "directory (no cgroup.controllers); set daemon.cgroup_root to the cgroup2 mount"
            )
        created_slice = False
        try:
            if not os.path.isdir(self.slice_path):
                os.mkdir(self.slice_path)
                created_slice = True
            if os.path.isdir(cgroup):
                cgroups.remove_cgroup(cgroup)  # an empty leftover of an earlier run
            os.mkdir(cgroup)
        except OSError as exc:
            self._discard_cgroup(cgroup, created_slice)
            raise PlacementError(
                f"could not create cgroup {exc.filename or cgroup}: {exc.strerror}; "
                "sparkd needs write access to the cgroup root (run as root or delegate it)"
            ) from exc
        return created_slice

    def _discard_cgroup(self, cgroup: str, created_slice: bool) -> None:
        """Undo a failed start: nothing of it may stay behind."""
        if os.path.isdir(cgroup):
            cgroups.kill_cgroup(cgroup)
            cgroups.wait_until_empty(cgroup, KILL_WAIT_SECONDS)
            cgroups.remove_cgroup(cgroup)
        if created_slice and os.path.isdir(self.slice_path):
            try:
                os.rmdir(self.slice_path)
            except OSError:
                pass  # another service appeared meanwhile; the slice is theirs too

    def _write_limits(self, spec: ServiceSpec, cgroup: str) -> tuple[bool, list[str]]:
        """Enable controllers and write limits: (memory enforced, notes on what is not)."""
        wanted = {"memory"} | ({"cpu"} if spec.cpu_weight is not None else set())
        try:
            missing = cgroups.enable_controllers(cgroup, wanted, self._mount())
        except OSError as exc:
            raise PlacementError(
                f"could not enable controllers {' '.join(sorted(wanted))} for {cgroup}: "
                f"{exc.strerror} (writing {exc.filename or 'cgroup.subtree_control'})"
            ) from exc
        notes = []
        writes = []
        if "memory" in missing:
            notes.append(self.why_not_enforced)
        else:
            oom_group = "0" if spec.oom_policy == "continue" else "1"
            writes += [("memory.max", str(spec.memory_max_bytes)), ("memory.oom.group", oom_group)]
            if spec.memory_high_bytes is not None:
                writes.append(("memory.high", str(spec.memory_high_bytes)))
            if os.path.exists(os.path.join(cgroup, "memory.swap.max")):
                writes.append(("memory.swap.max", str(spec.swap_max_bytes)))
            else:  # the kernel runs without swap accounting (swapaccount=0)
                notes.append(f"swap_max {spec.swap_max_bytes} is not applied: no memory.swap.max "
                             "(swap accounting is off in this kernel)")
        if spec.cpu_weight is not None:
            if "cpu" in missing:
                notes.append(f"cpu_weight {spec.cpu_weight} is not applied: no cpu controller")
            else:
                writes.append(("cpu.weight", str(spec.cpu_weight)))
        for filename, value in writes:
            try:
                cgroups.write_text(cgroup, filename, value)
            except OSError as exc:
                raise PlacementError(
                    f"could not write {value} to {os.path.join(cgroup, filename)}: {exc.strerror}"
                ) from exc
        return "memory" not in missing, notes

    # -- state files ----------------------------------------------------------------------------

    def _state_file(self, name: str) -> str:
        return os.path.join(self.state_dir, f"{name}.json")

    def _exit_record(self, name: str) -> str:
        return os.path.join(self.state_dir, f"{name}.exit.json")

    def log_path(self, name: str) -> str:
        """Where the service's stdout and stderr go."""
        return os.path.join(self.state_dir, f"{name}.log")

    def _save_state(self, svc: _Service, launcher_pid: int) -> None:
        state = {"status": svc.status.to_dict(), "oom_policy": svc.oom_policy,
                 "launcher_pid": launcher_pid, "notes": svc.notes}
        path = self._state_file(svc.name)
        try:
            with open(f"{path}.tmp", "w") as f:
                json.dump(state, f)
            os.replace(f"{path}.tmp", path)
        except OSError as exc:
            raise PlacementError(f"could not save service state {path}: {exc.strerror}") from exc

    def _load_json(self, path: str) -> dict | None:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    # -- monitoring -----------------------------------------------------------------------------

    def _track(self, svc: _Service, watch: bool) -> None:
        svc.done = asyncio.get_running_loop().create_future()
        self._services[svc.name] = svc
        if watch:
            svc.monitor = asyncio.create_task(self._monitor(svc), name=f"cgroupfs-{svc.name}")
        self._notify(svc)

    def _notify(self, svc: _Service) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(replace(svc.status))
        except Exception:
            log.exception("Failed to report the status of %s, ignoring", svc.name)

    async def _monitor(self, svc: _Service) -> None:
        while True:
            try:
                if self._poll(svc):
                    return
            except OSError as exc:
                log.warning("Failed to watch %s in %s, ignoring: %s", svc.name, svc.cgroup, exc)
            await asyncio.sleep(self._poll_seconds)

    def _poll(self, svc: _Service) -> bool:
        """One look at the service; True once it has ended and is finished."""
        self._check_oom(svc)
        launcher_exited = svc.launcher is not None and svc.launcher.poll() is not None
        try:
            populated = cgroups.is_populated(svc.cgroup)
        except FileNotFoundError:
            populated = False  # removed behind our back: nothing runs there any more
        if not populated and (svc.launcher is None or launcher_exited):
            self._finish(svc)
            return True
        if populated and (launcher_exited or os.path.exists(self._exit_record(svc.name))):
            # The main process is gone, so the service is over; the launcher kills leftovers
            # itself where cgroup.kill exists, this covers older kernels and a killed launcher.
            cgroups.kill_cgroup(svc.cgroup)
        return False

    def _check_oom(self, svc: _Service) -> None:
        events = cgroups.read_memory_events(svc.cgroup) if os.path.isdir(svc.cgroup) else None
        if svc.oom_kill_seen or not events or events.get("oom_kill", 0) == 0:
            return
        svc.oom_kill_seen = True
        counters = ", ".join(f"{k} {events.get(k, 0)}" for k in ("oom", "oom_kill", "oom_group_kill"))
        svc.notes.append(f"memory.events at the OOM kill: {counters}")
        log.warning("%s: oom_kill %d in %s/memory.events (oom_policy %s)",
                    svc.name, events["oom_kill"], svc.cgroup, svc.oom_policy)
        if svc.oom_policy == "continue":
            return
        # OOMPolicy=stop: the kernel killed a process; the service as a whole is over.
        svc.status.active_state, svc.status.sub_state = "deactivating", "stop-sigkill"
        svc.status.message = f"oom_kill {events['oom_kill']} in memory.events: stopping the service"
        self._notify(svc)
        cgroups.kill_cgroup(svc.cgroup)

    def _finish(self, svc: _Service) -> None:
        record = self._load_json(self._exit_record(svc.name))
        launcher_status = svc.launcher.returncode if svc.launcher is not None else None
        result = final_result(record, svc.oom_kill_seen, svc.oom_policy, svc.stop_requested,
                              svc.stop_timed_out, launcher_status)
        svc.status.active_state = result.active_state
        svc.status.sub_state = "dead" if result.active_state == "inactive" else "failed"
        svc.status.result = result.result
        svc.status.exec_main_status = result.exec_main_status
        notes = [result.message, *svc.notes]
        try:
            cgroups.remove_cgroup(svc.cgroup)
            for path in (self._exit_record(svc.name), self._state_file(svc.name)):
                if os.path.exists(path):
                    os.unlink(path)
        except OSError as exc:
            notes.append(f"could not remove {exc.filename}: {exc.strerror}")
        svc.status.message = "; ".join(notes)
        log.info("%s ended: %s (%s)", svc.name, result.result, result.message)
        svc.done.set_result(replace(svc.status))
        self._notify(svc)

    # -- stop, status, adopt --------------------------------------------------------------------

    async def stop(self, name: str, timeout_seconds: float) -> ServiceStatus:
        svc = self._services.get(name)
        if svc is None:
            raise PlacementError(f"could not stop {name}: sparkd placed no such service")
        if svc.done.done():
            return svc.done.result()
        svc.stop_requested = True
        svc.status.active_state, svc.status.sub_state = "deactivating", "stop-sigterm"
        self._notify(svc)
        self._signal(svc, signal.SIGTERM)
        try:
            return await asyncio.wait_for(asyncio.shield(svc.done), timeout_seconds)
        except TimeoutError:
            pass
        svc.stop_timed_out = True
        svc.status.sub_state = "stop-sigkill"
        self._notify(svc)
        self._signal(svc, None)
        try:
            return await asyncio.wait_for(asyncio.shield(svc.done), KILL_WAIT_SECONDS)
        except TimeoutError:
            left = cgroups.procs(svc.cgroup, recursive=True) if os.path.isdir(svc.cgroup) else []
            raise PlacementError(
                f"could not stop {name}: processes {left} survived cgroup.kill for "
                f"{KILL_WAIT_SECONDS} s in {svc.cgroup} (stuck in the kernel, e.g. D state)"
            ) from None

    def _signal(self, svc: _Service, sig: int | None) -> None:
        """SIGTERM every process of the service, or (sig None) kill them all via cgroup.kill."""
        try:
            if sig is None:
                cgroups.kill_cgroup(svc.cgroup)
            else:
                cgroups.signal_cgroup(svc.cgroup, sig)
        except FileNotFoundError:
            pass  # already gone; the monitor finishes it

    async def status(self, name: str) -> ServiceStatus | None:
        svc = self._services.get(name)
        return None if svc is None else replace(svc.status)

    async def adopt(self) -> list[ServiceStatus]:
        """Track every sparkd-*.service cgroup of the slice this instance does not know yet.

        A cgroup with processes becomes an active service again (never killed, never started
        twice). One whose processes ended while sparkd was away is finished at once: its
        status (inactive or failed, with the recorded result) is returned and its cgroup removed.
        """
        try:
            entries = sorted(os.listdir(self.slice_path))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise PlacementError(f"could not list {self.slice_path}: {exc.strerror}") from exc
        adopted = []
        for entry in entries:
            if not (entry.startswith("sparkd-") and entry.endswith(".service")):
                continue
            name = entry.removeprefix("sparkd-").removesuffix(".service")
            known = self._services.get(name)
            if known is not None and not known.done.done():
                continue  # watched already: adopting twice would duplicate it
            svc = self._revive(name, os.path.join(self.slice_path, entry))
            populated = cgroups.is_populated(svc.cgroup)
            self._track(svc, watch=populated)
            if not populated:
                self._finish(svc)
            adopted.append(replace(svc.status))
        return adopted

    def _revive(self, name: str, cgroup: str) -> _Service:
        state = self._load_json(self._state_file(name)) or {}
        saved = state.get("status", {})
        status = ServiceStatus(
            name=name, backend=self.name, unit=unit_name(name), cgroup=cgroup,
            active_state="active", sub_state="running", main_pid=saved.get("main_pid"),
            memory_enforced=saved.get("memory_enforced", False),
            memory_max_bytes=saved.get("memory_max_bytes"),
            memory_high_bytes=saved.get("memory_high_bytes"),
            message=saved.get("message", "adopted without saved state: limits unknown"),
        )
        return _Service(name, cgroup, status, state.get("oom_policy", "stop"),
                        notes=state.get("notes", []))

    async def close(self) -> None:
        """Stop watching; the services keep running and a new instance can adopt them."""
        for svc in self._services.values():
            if svc.monitor is not None:
                svc.monitor.cancel()
        for svc in self._services.values():
            if svc.monitor is not None:
                try:
                    await svc.monitor
                except asyncio.CancelledError:
                    pass
