"""sparkctl bench and top's engine columns against a real sparkd (cgroupfs placement on the real
cgroup2 tree) running `sparkd-engine serve` on a generated tiny model as an embedded service:
output shape, the history line, bad inputs (unknown service, not an embedded engine, not
running, bad numbers) and that a failed bench appends nothing."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from sparkd_harness import CGROUP2, ROOT, Sparkd, remove_cgroup_tree, service, sparkctl, status_json
from test_top import top_once

pytestmark = [pytest.mark.root, pytest.mark.slow]
# The engine imports torch and loads the model; a minute only trips on a wedged box.
READY_TIMEOUT_SECONDS = 60.0
SMALL = ["--prompt-tokens", "8", "--gen-tokens", "4", "--runs", "2"]
API_KEY = "bench-key-1"  # tiny is served with --api-key-file: every bench below authenticates


def _engine_script(where: Path) -> Path:
    script = where / "sparkd-engine"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m sparkd.engine.cli \"$@\"\n")
    script.chmod(0o755)
    return script


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """sparkd with a started embedded engine (tiny), a plain command (sleeper) and a stopped engine (cold)."""
    sys.path.insert(0, str(ROOT / "tests" / "engine" / "server"))
    from engine_server import free_port, make_tiny_model

    tmp = tmp_path_factory.mktemp("bench")
    cgroup_root = CGROUP2 / f"sparkd-test-bench-{os.getpid()}-{time.monotonic_ns()}"
    cgroup_root.mkdir()
    run_dir = Path(tempfile.mkdtemp(prefix="sparkd-bench-", dir="/tmp"))
    sock = run_dir / "control.sock"
    model = make_tiny_model(tmp / "tiny.gguf")
    key_file = tmp / "api-key"
    key_file.write_text(API_KEY + "\n")
    embedded = {"model": str(model), "alias": "tiny", "ctx": 64, "extra_args": ["--threads", "1"]}
    policy = {
        "daemon": {"placement": "cgroupfs", "cgroup_root": str(cgroup_root), "state_dir": str(tmp / "state"),
                   "control_socket": str(sock), "engine_executable": str(_engine_script(tmp))},
        "guards": {"reserve": "64M", "competitors": []},
        "services": {
            "tiny": {"engine": {"embedded": {**embedded, "listen": f"127.0.0.1:{free_port()}",
                                             "api_key_file": str(key_file)}},
                     "memory_max": "1G", "stop_timeout": "10s"},
            "cold": {"engine": {"embedded": {**embedded, "listen": f"127.0.0.1:{free_port()}"}}, "memory_max": "1G"},
            "sleeper": {"engine": {"command": ["sleep", "10000"]}, "memory_max": "256M", "stop_timeout": "5s"}},
    }
    (tmp / "policy.yaml").write_text(yaml.safe_dump(policy))
    daemon = Sparkd(tmp / "policy.yaml", sock, tmp / "sparkd.log")
    try:
        daemon.start()
        for name in ("tiny", "sleeper"):
            started = sparkctl(sock, "start", name)
            assert started.returncode == 0, started.stdout + started.stderr
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while (engine := service(status_json(sock), "tiny")["engine"])["health"] != "ready":
            assert engine["health"] in ("loading", "unreachable"), engine
            assert time.monotonic() < deadline, (engine, daemon.log_text())
            time.sleep(0.2)
        yield {"sock": sock, "state": tmp / "state", "tmp": tmp, "key_file": key_file}
    finally:
        daemon.ensure_dead()
        remove_cgroup_tree(cgroup_root)
        shutil.rmtree(run_dir, ignore_errors=True)


def _history(state: Path) -> list[dict]:
    path = state / "bench-history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_bench_prints_the_figures_and_appends_one_history_line(live):
    before = len(_history(live["state"]))
    out = sparkctl(live["sock"], "bench", "tiny", *SMALL)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert re.search(r"^tiny: model tiny at http://127\.0\.0\.1:\d+, budget 896\.0M, 2 run\(s\) of 8 prompt \+ 4 "
                     r"generated tokens", text, re.M), text
    assert re.search(r"MIN\s+MEDIAN\s+MAX", text)
    for label in ("prompt tok/s", "decode tok/s", "TTFT s"):
        row = next(line for line in text.splitlines() if line.startswith(label))
        low, mid, high = (float(v) for v in row[len(label):].split())
        assert 0 < low <= mid <= high, row
    assert f"appended to {live['state'] / 'bench-history.jsonl'}" in text
    history = _history(live["state"])
    assert len(history) == before + 1
    line = history[-1]
    assert line["service"] == "tiny" and line["model"] == "tiny" and line["budget_bytes"] == 896 << 20
    assert line["memory_max_bytes"] == 1 << 30 and line["prompt_tokens"] == 8 and line["gen_tokens"] == 4
    assert line["commit"] and line["machine"]["hostname"] == os.uname().nodename
    assert line["machine"]["cpu"] and line["machine"]["memory_total_bytes"] > 0
    assert [r["prompt_tokens"] for r in line["runs"]] == [8, 8]
    assert all(1 <= r["completion_tokens"] <= 4 and r["ttft_seconds"] > 0 for r in line["runs"])
    assert line["ttft_seconds"]["min"] <= line["ttft_seconds"]["median"] <= line["ttft_seconds"]["max"]


def test_bench_json_is_the_history_record_and_no_save_appends_nothing(live):
    before = _history(live["state"])
    out = sparkctl(live["sock"], "bench", "tiny", *SMALL, "--json", "--no-save")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert set(record) >= {"time", "service", "url", "model", "budget_bytes", "commit", "machine", "runs",
                           "ttft_seconds", "prompt_tokens_per_second", "decode_tokens_per_second"}
    assert set(record["decode_tokens_per_second"]) == {"min", "median", "max"}
    assert _history(live["state"]) == before


def test_bench_state_dir_flag(live):
    other = live["tmp"] / "elsewhere"
    out = sparkctl(live["sock"], "bench", "tiny", "--prompt-tokens", "4", "--gen-tokens", "2", "--runs", "1",
                   "--state-dir", str(other))
    assert out.returncode == 0, out.stderr
    assert len(_history(other)) == 1


@pytest.mark.parametrize("name, message", [
    ("nosuch", "could not benchmark 'nosuch': sparkd has no such service (known: cold, sleeper, tiny)"),
    ("sleeper", "could not benchmark 'sleeper': it is not an embedded engine (engine: command)"),
    ("cold", "could not benchmark 'cold': the service is inactive; start it with sparkctl start cold"),
])
def test_bench_refuses_what_it_cannot_measure(live, name, message):
    before = _history(live["state"])
    out = sparkctl(live["sock"], "bench", name, *SMALL)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith(f"sparkctl bench: {message}"), out.stderr
    assert _history(live["state"]) == before


@pytest.mark.parametrize("content, message", [
    (b"rotated-key\n", "HTTP 401: could not authenticate: wrong API key; pass --api-key, or check the service's "
                       "engine.embedded.api_key_file"),
    (b"\xff\xfe", "could not benchmark 'tiny': could not read API key file {key}: not UTF-8 text "
                  "(services.tiny.engine.embedded.api_key_file); or pass --api-key"),
    (None, "could not benchmark 'tiny': could not read API key file {key}: No such file or directory; create it"),
])
def test_bench_reads_the_api_key_file_and_names_it_when_it_cannot(live, content, message):
    """The engine read the key at start; bench reads the file now: a rotated, garbled or missing
    file is named, and --api-key still wins over the file."""
    before = _history(live["state"])
    key = live["key_file"]
    key.unlink()
    if content is not None:
        key.write_bytes(content)
    try:
        out = sparkctl(live["sock"], "bench", "tiny", *SMALL)
        assert out.returncode == 1 and out.stdout == ""
        assert message.format(key=key) in out.stderr, out.stderr
        assert _history(live["state"]) == before
        given = sparkctl(live["sock"], "bench", "tiny", *SMALL, "--no-save", "--api-key", API_KEY)
        assert given.returncode == 0, given.stderr
    finally:
        key.write_text(API_KEY + "\n")


def test_bench_reports_the_engine_refusing_a_prompt_too_long(live):
    before = _history(live["state"])
    out = sparkctl(live["sock"], "bench", "tiny", "--prompt-tokens", "100", "--gen-tokens", "4", "--runs", "1")
    assert out.returncode == 1
    assert re.search(r"sparkctl bench: could not run the benchmark request at http://127\.0\.0\.1:\d+: HTTP 400", out.stderr)
    assert _history(live["state"]) == before


@pytest.mark.parametrize("args", [["--runs", "0"], ["--prompt-tokens", "-3"], ["--gen-tokens", "many"]])
def test_bench_bad_numbers_are_usage_errors(tmp_path, args):
    out = sparkctl(tmp_path / "absent.sock", "bench", "tiny", *args)
    assert out.returncode == 2 and f"argument {args[0]}" in out.stderr
    assert not list(tmp_path.iterdir())


def test_bench_without_sparkd_fails_clearly(tmp_path):
    out = sparkctl(tmp_path / "absent.sock", "bench", "tiny")
    assert out.returncode == 1
    assert f"sparkctl bench: could not connect to sparkd at {tmp_path / 'absent.sock'}" in out.stderr


def test_top_shows_the_engine_columns_and_events(live):
    assert sparkctl(live["sock"], "bench", "tiny", *SMALL, "--no-save").returncode == 0  # so it has a decode speed
    out = top_once(live["sock"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    tiny = next(line for line in lines if line.startswith("tiny"))
    tok_s, queue, cache, disk = tiny.split()[-4:]
    assert float(tok_s) > 0 and queue == "0"
    assert cache == disk == "–"  # every expert of the tiny model is resident: no expert cache
    assert next(line for line in lines if line.startswith("sleeper")).split()[-4:] == ["–"] * 4
    assert "last events" in lines
    assert all(len(line) <= 80 for line in lines) and len(lines) <= 24
