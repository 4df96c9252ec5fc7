"""Process competitors with real processes (renamed copies of sleep); unit competitors without systemd.

Unit competitors against a real systemd run in the systemd sandbox tests (SystemdBus is the
UnitManager); here PID 1 is not systemd, so they must be reported as skipped with the reason.
"""

import signal

import pytest

from procs import reap, spawn_named, unique_name
from sparkd.guards import GuardContext, preflight
from sparkd.guards.competitors import check_competitors
from sparkd.policy import parse_policy

GiB = 1 << 30


def guards_with(*competitors):
    return parse_policy({"guards": {"competitors": list(competitors)}}, source="test", total_memory_bytes=64 * GiB).guards


@pytest.fixture
def spawn(tmp_path):
    procs = []

    def start(prefix="ollama-runner-test", **kw):
        name = unique_name(prefix)
        procs.append(spawn_named(tmp_path, name, **kw))
        return procs[-1], name

    yield start
    for proc in procs:
        reap(proc)


async def test_terminate_sends_sigterm_and_reports_the_eviction(spawn):
    a, name = spawn()
    (check,) = await check_competitors(guards_with({"process": name, "action": "terminate", "term_timeout": 30}),
                                       gpu_mib_by_pid={a.pid: 2048})
    assert check.status == "ok" and check.message == f"sent SIGTERM to {name}: all exited"
    assert [(c.pid, c.name, c.mib, c.detail) for c in check.culprits] == [(a.pid, name, 2048, "SIGTERM, exited")]
    assert a.ended_by() == signal.SIGTERM


async def test_every_matching_process_is_evicted(spawn, tmp_path):
    a, name = spawn()
    (tmp_path / "second").mkdir()
    b = spawn_named(tmp_path / "second", name)  # a second process of the same name
    try:
        (check,) = await check_competitors(guards_with({"process": name, "action": "stop"}))
        assert check.status == "ok" and {c.pid for c in check.culprits} == {a.pid, b.pid}
        assert (a.ended_by(), b.ended_by()) == (signal.SIGTERM, signal.SIGTERM)
    finally:
        reap(b)


async def test_sigterm_ignored_without_kill_refuses_and_leaves_it_running(spawn):
    proc, name = spawn("stubborn-runner", ignore_sigterm=True)
    (check,) = await check_competitors(guards_with({"process": name, "action": "terminate", "term_timeout": 0.5}))
    assert check.status == "refused" and check.policy_key == "guards.competitors[0].kill_after_timeout"
    assert f"{name} (pid {proc.pid}) still running 0.5 s after SIGTERM" in check.message
    assert [(c.pid, c.detail) for c in check.culprits] == [(proc.pid, "survived SIGTERM")]
    assert proc.alive()  # never SIGKILLed


async def test_sigterm_ignored_with_kill_after_timeout_kills(spawn):
    proc, name = spawn("stubborn-runner", ignore_sigterm=True)
    (check,) = await check_competitors(guards_with(
        {"process": name, "action": "terminate", "term_timeout": 0.5, "kill_after_timeout": True}))
    assert check.status == "ok" and check.policy_key == "guards.competitors[0].kill_after_timeout"
    assert check.culprits[0].detail == "SIGTERM ignored, SIGKILL, exited"
    assert proc.ended_by() == signal.SIGKILL


@pytest.mark.parametrize("action, dry_run, status", [("refuse", False, "refused"), ("ignore", False, "ok"),
                                                      ("terminate", True, "warning")])
async def test_refuse_ignore_and_dry_run_leave_it_running(spawn, action, dry_run, status):
    proc, name = spawn()
    (check,) = await check_competitors(guards_with({"process": name, "action": action}), dry_run=dry_run)
    assert check.status == status and check.policy_key == "guards.competitors[0].action"
    assert [c.pid for c in check.culprits] == [proc.pid]
    assert proc.alive()


async def test_absent_process_is_ok():
    (check,) = await check_competitors(guards_with({"process": unique_name("nobody"), "action": "terminate"}))
    assert check.status == "ok" and check.message.startswith("no process named nobody-")


async def test_units_without_systemd_are_skipped_with_the_reason():
    checks = await check_competitors(guards_with({"unit": "ollama.service"}, {"unit": "x.service", "action": "ignore"}),
                                     no_unit_manager_reason="PID 1 is not systemd")
    assert [(c.status, c.message) for c in checks] == [
        ("skipped", "could not check ollama.service: PID 1 is not systemd"), ("ok", "x.service ignored by policy")]


async def test_unknown_service_evicts_nothing(spawn):
    proc, name = spawn()
    pol = parse_policy({"guards": {"competitors": [{"process": name, "action": "terminate"}]}},
                       source="test", total_memory_bytes=64 * GiB)
    with pytest.raises(Exception, match="could not run preflight for service 'ghost'"):
        await preflight(pol, "ghost", GuardContext())
    assert proc.alive()


async def test_preflight_evicts_before_it_measures(spawn):
    proc, name = spawn()
    pol = parse_policy({"guards": {"competitors": [{"process": name, "action": "terminate"}]}},
                       source="test", total_memory_bytes=64 * GiB)
    report = await preflight(pol, None, GuardContext())
    assert report.checks[0].name == f"competitor[{name}]" and report.checks[0].status == "ok"
    assert f"pid {proc.pid} {name} (SIGTERM, exited)" in report.render()
    assert proc.ended_by() == signal.SIGTERM


def test_bad_competitor_entries_are_policy_errors():
    from sparkd.errors import PolicyError
    with pytest.raises(PolicyError, match=r"guards.competitors.0: .*needs a 'unit'"):
        guards_with({"process": "ollama", "action": "stop_and_disable"})
    with pytest.raises(PolicyError, match=r"guards.gpu_busy_mib"):
        parse_policy({"guards": {"gpu_busy_mib": -1}}, source="test", total_memory_bytes=GiB)
