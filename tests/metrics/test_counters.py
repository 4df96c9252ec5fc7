"""SparkdCounters: what the supervisor and watchers count, with literal inputs."""

from __future__ import annotations

import pytest
from sparkd.metrics.counters import SparkdCounters, guard_reason


def test_preflight_counts_refusals_by_guard_and_real_evictions_only():
    c = SparkdCounters()
    report = {"service": "llm", "refused": True, "checks": [
        {"name": "competitor[ollama.service]", "status": "ok", "culprits": [
            {"name": "ollama.service", "detail": "stopped and disabled"}]},
        {"name": "competitor[llama-server]", "status": "ok", "culprits": [{"name": "llama-server", "detail": "ignored"}]},
        {"name": "competitor[foo]", "status": "ok", "culprits": []},
        {"name": "gpu", "status": "refused", "culprits": [{"name": "x"}]},
        {"name": "headroom[llm]", "status": "refused", "culprits": []},
        {"name": "swap[llm]", "status": "ok", "culprits": []},
    ]}
    c.observe_preflight(report)
    c.observe_preflight(report)
    snap = c.snapshot()
    assert snap["refusals"] == {("llm", "gpu"): 2, ("llm", "headroom"): 2}
    assert snap["evictions"] == {"ollama.service": 2}


def test_guard_reason_drops_the_bracket():
    assert [guard_reason(n) for n in ("headroom[a]", "competitor[ollama.service]", "gpu")] == [
        "headroom", "competitor", "gpu"]


def test_watcher_feeds():
    c = SparkdCounters()
    c.nvrm_event(None, "out_of_memory")
    c.nvrm_event(79, "node")
    c.nvrm_event(79, "node")
    c.action("shrink", "shrink_cache", "dry_run")
    c.watcher_health("psi", True, "trigger", service="llm")
    c.watcher_health("psi", False, "poll", service="llm")  # replaces, never two series per watcher
    c.watcher_health("kmsg", True, "kmsg")
    c.watcher_removed("kmsg")
    snap = c.snapshot()
    assert snap["nvrm"] == {("none", "out_of_memory"): 1, ("79", "node"): 2}
    assert snap["actions"] == {("shrink", "shrink_cache", "dry_run"): 1}
    assert {k: (h.up, h.mode) for k, h in snap["watchers"].items()} == {("psi", "llm"): (False, "poll")}


def test_unbounded_label_values_are_refused():
    c = SparkdCounters()
    with pytest.raises(ValueError, match=r"unknown NVRM bucket 'oom'; expected one of \['application', 'node'"):
        c.nvrm_event(31, "oom")
    with pytest.raises(ValueError, match="unknown action outcome 'ok'"):
        c.action("r", "stop", "ok")
    assert c.snapshot()["nvrm"] == {} and c.snapshot()["actions"] == {}
