"""check-policy (both CLIs) and sparkctl's usage errors, run as real processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], env=ENV, capture_output=True, text=True, timeout=60)


GOOD = """
daemon: {placement: cgroupfs}
services:
  llm:
    engine: {command: [sleep, "1000"]}
    memory_max: 512M
"""


@pytest.mark.parametrize("module", ["sparkd.cli.daemon", "sparkd.cli.sparkctl"])
def test_check_policy_good(tmp_path, module):
    f = tmp_path / "p.yaml"
    f.write_text(GOOD)
    out = run(module, "check-policy", str(f), "--json")
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)
    assert resolved["services"]["llm"]["memory_max"] == 512 << 20
    assert resolved["services"]["llm"]["restart"] == "no"
    human = run(module, "check-policy", str(f))
    assert human.returncode == 0 and "valid" in human.stdout and "memory_max: 536870912" in human.stdout


@pytest.mark.parametrize("module", ["sparkd.cli.daemon", "sparkd.cli.sparkctl"])
def test_check_policy_bad(tmp_path, module):
    f = tmp_path / "bad.yaml"
    f.write_text("services:\n  llm:\n    engine: {command: [sleep]}\n    memory_maxx: 1G\n")
    out = run(module, "check-policy", str(f))
    assert out.returncode == 1
    assert f"could not load policy {f}" in out.stderr
    assert "services.llm.memory_maxx: unknown key (did you mean 'memory_max'?)" in out.stderr
    assert out.stdout == ""


def test_check_policy_missing_file(tmp_path):
    out = run("sparkd.cli.sparkctl", "check-policy", str(tmp_path / "none.yaml"))
    assert out.returncode == 1 and "could not read policy" in out.stderr


@pytest.mark.parametrize("args", [[], ["bogus"], ["start"], ["status", "--nope"], ["stop", "a", "b"]])
def test_sparkctl_usage_errors_exit_2(args):
    out = run("sparkd.cli.sparkctl", *args)
    assert out.returncode == 2, out
    assert "usage: sparkctl" in out.stderr


def test_help_documents_exit_codes():
    out = run("sparkd.cli.sparkctl", "--help")
    assert out.returncode == 0
    assert "2  usage error" in out.stdout and "1  refused" in out.stdout


def test_sparkd_usage_error_exit_2():
    assert run("sparkd.cli.daemon", "frobnicate").returncode == 2


def test_missing_socket_is_a_clear_error(tmp_path):
    sock = tmp_path / "control.sock"
    out = run("sparkd.cli.sparkctl", "--socket", str(sock), "status")
    assert out.returncode == 1
    assert out.stderr.strip() == f"sparkctl: could not connect to sparkd at {sock}: no such file or directory; is sparkd running?"
