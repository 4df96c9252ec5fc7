"""Metric families built from a SparkdCounters snapshot (what the supervisor and watchers counted)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# family name (without _total), help, label names, snapshot table
_COUNTERS = (
    ("sparkd_service_starts", "Starts sparkd performed", ("service",), "starts"),
    ("sparkd_service_stops", "Stops sparkd was asked for", ("service",), "stops"),
    ("sparkd_service_exits", "Runs that ended, by systemd Result (success, exit-code, oom-kill, start-failed ...)",
     ("service", "result"), "exits"),
    ("sparkd_guard_refusals", "Starts refused, by the guard that refused", ("service", "reason"), "refusals"),
    ("sparkd_competitor_evictions", "Competitors the guards stopped or terminated before a start",
     ("competitor",), "evictions"),
    ("sparkd_nvrm_events", "NVIDIA driver (NVRM) kernel log events, by Xid and bucket", ("xid", "bucket"), "nvrm"),
    ("sparkd_actions", "Actions the watcher rules decided, by outcome", ("rule", "action", "outcome"), "actions"),
    ("sparkd_watcher_errors", "Errors a watcher survived", ("watcher", "service"), "watcher_errors"),
    ("sparkd_scrape_errors", "Metric sources that failed during a scrape", ("source",), "scrape_errors"),
)


def _labels(key) -> list[str]:
    return list(key) if isinstance(key, tuple) else [key]


def counter_families(snapshot: dict[str, dict]) -> Iterator[Metric]:
    for name, doc, labels, table in _COUNTERS:
        family = CounterMetricFamily(name, doc, labels=list(labels))
        for key, value in sorted(snapshot[table].items()):
            family.add_metric(_labels(key), value)
        yield family
    up = GaugeMetricFamily("sparkd_watcher_up", "1 while a watcher runs, 0 when it failed; mode says how it watches",
                           labels=["watcher", "service", "mode"])
    for (watcher, service), health in sorted(snapshot["watchers"].items()):
        up.add_metric([watcher, service, health.mode], 1.0 if health.up else 0.0)
    yield up
