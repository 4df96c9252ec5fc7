"""Every family sparkd exports follows Prometheus' naming conventions (walked, not listed)."""

from __future__ import annotations

import re

from metrics_fixtures import full_collector, scrape
from prometheus_client.parser import text_string_to_metric_families

# Base units only (bytes, seconds, ratios); _info for info metrics; _total is added by counters.
UNIT_SUFFIXES = ("_bytes", "_seconds", "_ratio", "_info", "_bytes_per_second")
# Gauges without a unit: a 0/1 state or a one-of-N enum, said in their help.
UNITLESS = {"sparkd_service_state", "sparkd_service_memory_max_enforced", "sparkd_gpu_nvml_up", "sparkd_watcher_up"}
NON_BASE = re.compile(r"_(milli|micro|nano|kilo|mega|giga)(seconds|bytes)|_(ms|us|usec|msec|kb|kib|mb|mib|gb|gib|percent|pct)(_|$)")
NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def families(tmp_path):
    return list(text_string_to_metric_families(scrape(full_collector(tmp_path))))


def test_every_family_follows_the_conventions(tmp_path):
    problems = []
    found = families(tmp_path)
    assert len(found) > 30
    for f in found:
        if not f.name.startswith("sparkd_") or f.name.startswith("sparkd_engine_"):
            problems.append(f"{f.name}: not in sparkd's own namespace")
        if not NAME.match(f.name):
            problems.append(f"{f.name}: not snake_case")
        if NON_BASE.search(f.name + "_"):
            problems.append(f"{f.name}: not a base unit")
        if not f.documentation:
            problems.append(f"{f.name}: no help text")
        if f.type == "counter":
            if not all(s.name.endswith("_total") for s in f.samples if not s.name.endswith("_created")):
                problems.append(f"{f.name}: counter sample without _total")
        elif f.type in ("gauge", "info"):
            if f.name.endswith("_total"):
                problems.append(f"{f.name}: a gauge named like a counter")
            if not (f.name.endswith(UNIT_SUFFIXES) or f.name in UNITLESS or f.type == "info"):
                problems.append(f"{f.name}: gauge without a unit suffix")
        else:
            problems.append(f"{f.name}: unexpected type {f.type}")
        for s in f.samples:
            if {"pid", "main_pid"} & set(s.labels):
                problems.append(f"{f.name}: pid label")
            if any(not NAME.match(k) for k in s.labels):
                problems.append(f"{f.name}: bad label name in {s.labels}")
    assert problems == []


def test_the_walk_catches_a_bad_name():
    bad = "# HELP sparkd_cache_mib x\n# TYPE sparkd_cache_mib gauge\nsparkd_cache_mib 1\n"
    (f,) = text_string_to_metric_families(bad)
    assert NON_BASE.search(f.name + "_") and not f.name.endswith(UNIT_SUFFIXES)
