"""The shipped rules checked and unit-tested by Prometheus' own promtool (Debian's prometheus
package; scripts/lib/setup.sh installs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "packaging" / "prometheus"
pytestmark = pytest.mark.skipif(not shutil.which("promtool"), reason="needs promtool (apt-get install prometheus)")


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_check_rules():
    out = promtool("check", "rules", str(PROM / "recording.yml"), str(PROM / "alerts.yml"))
    assert out.returncode == 0, out.stdout + out.stderr


def test_check_scrape_config():
    out = promtool("check", "config", str(PROM / "scrape.yml"))
    assert out.returncode == 0, out.stdout + out.stderr


def test_rule_unit_tests_pass():
    out = promtool("test", "rules", str(PROM / "tests" / "alerts_test.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_firing_case():
    alerts = {r["alert"] for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"] for r in g["rules"]
              if "alert" in r}
    tests = yaml.safe_load((PROM / "tests" / "alerts_test.yml").read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]  # a recording rule's test has none
    fired = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert alerts - fired == set()
    assert alerts - quiet == set()  # and a near miss (too early, too small) that must stay quiet


def test_a_broken_threshold_fails_the_unit_tests(tmp_path):
    """The unit tests can fail: raise the pressure threshold and promtool must say so."""
    (tmp_path / "tests").mkdir()
    alerts = (PROM / "alerts.yml").read_text().replace("stalled:rate1m > 0.10", "stalled:rate1m > 0.30")
    (tmp_path / "alerts.yml").write_text(alerts)
    shutil.copy(PROM / "recording.yml", tmp_path)
    shutil.copy(PROM / "tests" / "alerts_test.yml", tmp_path / "tests")
    out = promtool("test", "rules", str(tmp_path / "tests" / "alerts_test.yml"))
    assert out.returncode != 0
    assert "alertname: SparkdServiceMemoryPressure, time: 8m" in out.stdout + out.stderr
