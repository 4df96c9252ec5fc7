"""How a cgroupfs service ended, in systemd's words (Result, ExecMainStatus), from what is known.

Pure: inputs are the launcher's exit record, what the monitor saw and what sparkd asked for,
so every branch is tested with literal inputs.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

# systemd counts these as a clean end of a service that was asked to stop.
CLEAN_STOP_SIGNALS = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE})


@dataclass(frozen=True)
class FinalResult:
    active_state: str  # inactive | failed
    result: str  # success | exit-code | signal | core-dump | oom-kill | timeout | unknown
    exec_main_status: int | None  # exit code, or signal number when killed by a signal
    message: str


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def final_result(
    record: dict | None,
    oom_kill_seen: bool,
    oom_policy: str,
    stop_requested: bool,
    stop_timed_out: bool,
    launcher_returncode: int | None,
) -> FinalResult:
    """record: {"exit_code": n} or {"signal": n, "core_dumped": bool}, None when not recorded
    (the launcher was killed with the service, or the record was lost).
    launcher_returncode: Popen-style (negative for a signal), None when sparkd is not its parent.
    """
    code = record.get("exit_code") if record else None
    sig = record.get("signal") if record else None
    status = code if code is not None else sig
    killed_outright = record is None or sig == signal.SIGKILL
    if oom_kill_seen and (oom_policy != "continue" or killed_outright):
        return FinalResult("failed", "oom-kill", status,
                           "the kernel OOM-killed the service (oom_kill in memory.events); "
                           "it was stopped as a whole and is not restarted")
    if stop_timed_out and killed_outright:
        return FinalResult("failed", "timeout", status,
                           "the service ignored SIGTERM past its stop timeout and was killed "
                           "with cgroup.kill")
    if code is not None:
        if code == 0:
            return FinalResult("inactive", "success", 0, "exited with status 0")
        return FinalResult("failed", "exit-code", code, f"exited with status {code}")
    if sig is not None:
        if record.get("core_dumped"):
            return FinalResult("failed", "core-dump", sig, f"dumped core on {_signal_name(sig)}")
        if stop_requested and sig in CLEAN_STOP_SIGNALS:
            return FinalResult("inactive", "success", sig, f"stopped by {_signal_name(sig)}")
        return FinalResult("failed", "signal", sig, f"killed by {_signal_name(sig)}")
    if launcher_returncode is not None and launcher_returncode < 0:
        return FinalResult("failed", "signal", None,
                           f"killed by {_signal_name(-launcher_returncode)} from outside sparkd "
                           "before its exit status was recorded")
    return FinalResult("failed", "unknown", None,
                       "ended without a recorded exit status (killed from outside sparkd, or "
                       "the record in the state directory was lost)")
