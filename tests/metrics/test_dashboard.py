"""The Grafana dashboard and the Prometheus rules use only metrics that exist: sparkd_ names from
the collector itself, sparkd_engine_ names from the contract in docs/metrics.md, recording-rule
names from recording.yml. docs/metrics.md lists exactly what the collector exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from metrics_fixtures import full_collector, scrape
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "packaging" / "grafana" / "sparkd.json"
PROM = ROOT / "packaging" / "prometheus"
DOC = ROOT / "docs" / "metrics.md"
METRIC = re.compile(r"\bsparkd_[a-z0-9_:]*")
QUOTED = re.compile(r'"[^"]*"')  # label values such as job="sparkd" are not metric names
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs(dash: dict) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def rule_exprs() -> list[str]:
    out = []
    for name in ("recording.yml", "alerts.yml"):
        out += [r["expr"] for g in yaml.safe_load((PROM / name).read_text())["groups"] for r in g["rules"]]
    return out


def recorded_names() -> set[str]:
    return {r["record"] for g in yaml.safe_load((PROM / "recording.yml").read_text())["groups"] for r in g["rules"]}


def doc_names(section: str) -> set[str]:
    """Names in the first column of the tables under '## <section>'."""
    text = DOC.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", text, flags=re.M))


def collector_samples(tmp_path) -> set[str]:
    return {s.name for f in text_string_to_metric_families(scrape(full_collector(tmp_path))) for s in f.samples}


def unknown_names(exprs: list[str], sparkd_samples: set[str]) -> list[str]:
    engine, recorded = doc_names("sparkd-engine (contract for issue 5)"), recorded_names()
    unknown = []
    for expr in exprs:
        for name in METRIC.findall(QUOTED.sub('""', expr)):
            if ":" in name:
                ok = name in recorded
            elif name.startswith("sparkd_engine_"):
                base = next((name[: -len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), name)
                ok = name in engine or base in engine
            else:
                ok = name in sparkd_samples
            if not ok:
                unknown.append(f"{name} in {expr}")
    return unknown


def test_dashboard_is_a_grafana_dashboard():
    dash = dashboard()
    assert dash["schemaVersion"] == 39 and dash["uid"] == "sparkd-overview" and dash["title"] == "sparkd"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert {"datasource", "instance", "service"} <= set(variables)
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for p in dash["panels"]:
        assert set(p["gridPos"]) == {"h", "w", "x", "y"} and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert [a for a in dash["annotations"]["list"] if "sparkd_nvrm_events_total" in a.get("expr", "")]


def test_dashboard_covers_what_the_issue_asks():
    text = " ".join(dashboard_exprs(dashboard()))
    for needed in ("sparkd_engine_generated_tokens_total", "sparkd_engine_time_to_first_token_seconds_bucket",
                   "sparkd_engine_cache_evictions_total", "sparkd_engine_read_bytes_total",
                   "sparkd_engine_read_busy_seconds_total", "sparkd_service_memory_current_bytes",
                   "sparkd_service_memory_max_bytes", "sparkd_service_pressure_memory_stalled_seconds_total",
                   "sparkd_memory_available_bytes", "sparkd_guard_reserve_bytes"):
        assert needed in text


def test_every_name_in_dashboard_and_rules_exists(tmp_path):
    samples = collector_samples(tmp_path)
    assert unknown_names(dashboard_exprs(dashboard()) + rule_exprs(), samples) == []


def test_the_name_check_catches_a_typo(tmp_path):
    samples = collector_samples(tmp_path)
    bad = ["rate(sparkd_engine_generated_token_total[1m])", "sparkd_service_memory_currnt_bytes", "sparkd_engine:nope:rate1m"]
    assert len(unknown_names(bad, samples)) == 3


def test_docs_list_exactly_what_the_collector_exports(tmp_path):
    families = {f.name + ("_total" if f.type == "counter" else "")
                for f in text_string_to_metric_families(scrape(full_collector(tmp_path)))}
    assert doc_names("sparkd") == families
