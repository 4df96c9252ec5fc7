"""How a cgroupfs service ended, from literal inputs (every branch of final_result)."""

import signal

import pytest

from sparkd.placement.cgroupfs_result import final_result

KILL = {"signal": signal.SIGKILL, "core_dumped": False}


@pytest.mark.parametrize(
    "record, oom, policy, stop, timed_out, launcher_rc, expected",
    [
        ({"exit_code": 0}, False, "stop", False, False, 0, ("inactive", "success", 0)),
        ({"exit_code": 3}, False, "stop", False, False, 0, ("failed", "exit-code", 3)),
        ({"exit_code": 3}, False, "stop", True, False, 0, ("failed", "exit-code", 3)),
        ({"signal": 15, "core_dumped": False}, False, "stop", True, False, 0, ("inactive", "success", 15)),
        ({"signal": 15, "core_dumped": False}, False, "stop", False, False, 0, ("failed", "signal", 15)),
        ({"signal": 11, "core_dumped": True}, False, "stop", False, False, 0, ("failed", "core-dump", 11)),
        # the OOM group kill takes the launcher with it: no record at all
        (None, True, "stop", False, False, -9, ("failed", "oom-kill", None)),
        (KILL, True, "continue", False, False, 0, ("failed", "oom-kill", 9)),
        # OOMPolicy=continue: a child was OOM-killed but the main process exited on its own
        ({"exit_code": 0}, True, "continue", False, False, 0, ("inactive", "success", 0)),
        (None, False, "stop", True, True, -9, ("failed", "timeout", None)),
        # the main process exited on SIGTERM just as the timeout fired: its own status counts
        ({"signal": 15, "core_dumped": False}, False, "stop", True, True, 0, ("inactive", "success", 15)),
        (None, False, "stop", False, False, -9, ("failed", "signal", None)),
        (None, False, "stop", False, False, None, ("failed", "unknown", None)),
    ],
)
def test_final_result(record, oom, policy, stop, timed_out, launcher_rc, expected):
    got = final_result(record, oom, policy, stop, timed_out, launcher_rc)
    assert (got.active_state, got.result, got.exec_main_status) == expected
    assert got.message
