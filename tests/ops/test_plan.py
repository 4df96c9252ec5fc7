"""sparkctl plan: the seed's Tables 8-9 reproduced exactly, the one-box alternative, the live
tok/s read from a real HTTP /metrics endpoint, and every bad input refused with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEED = ["--users", "50", "--tok-s", "0.37", "--hours", "8", "--utilization", "70%",
        "--profile", "light=5x300", "--profile", "moderate=20x500", "--profile", "intensive=50x800",
        "--watts", "240", "--price", "4000", "--checkpoint", "539G"]
# Tables 8 and 9 of the seed study, as printed there.
TABLE_8_9 = {
    "light": (11, 13.5, 2.6, 44_000, 5.8),
    "moderate": (68, 22.5, 16.3, 272_000, 35.8),
    "intensive": (269, 36.0, 64.6, 1_076_000, 141.6),
}


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkd.cli.sparkctl", "plan", *args], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "COLUMNS": "100", "PATH": "/usr/bin:/bin"}, timeout=60)


def plan_json(*args: str) -> dict:
    out = plan(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_reproduces_seed_tables_8_and_9_exactly():
    body = plan_json(*SEED)
    got = {p["profile"]: (p["boxes"], p["latency_minutes"], p["power_kilowatts"], p["investment"], p["storage_tebibytes"])
           for p in body["profiles"]}
    assert got == TABLE_8_9
    assert body["box_capacity_slot_seconds_per_day"] == 8 * 3600 * 0.7


def test_human_output_shows_the_tables_and_says_latency_does_not_improve():
    out = plan(*SEED)
    assert out.returncode == 0, out.stderr
    for row in ("light            5     300  13.5 min     11   2.6 kW     44 000 USD    5.8 TiB",
                "moderate        20     500  22.5 min     68  16.3 kW    272 000 USD   35.8 TiB",
                "intensive       50     800  36.0 min    269  64.6 kW  1 076 000 USD  141.6 TiB"):
        assert row in out.stdout
    assert "more boxes raise throughput (requests served per day), not the latency of one request" in out.stdout


def test_box_count_on_a_whole_number_is_not_rounded_up():
    # 1 user x 1 request x 2016 tokens at 0.1 tok/s = 20160 s = exactly one box at 8 h x 70 %.
    body = plan_json("--users", "1", "--tok-s", "0.1", "--requests-per-user", "1", "--tokens-per-response", "2016")
    assert [p["boxes"] for p in body["profiles"]] == [1]
    body = plan_json("--users", "1", "--tok-s", "0.1", "--requests-per-user", "1", "--tokens-per-response", "2017")
    assert [p["boxes"] for p in body["profiles"]] == [2]


def test_oversubscribed_checkpoint_is_named_and_alternative_offered():
    body = plan_json(*SEED, "--box-memory", "121G")
    assert any("4.5× one box's memory" in n and "5 boxes' memory pooled" in n for n in body["notes"])
    assert any("--fit-tok-s" in n for n in body["notes"])
    assert body["alternative"] is None


def test_one_box_model_shown_when_it_is_the_better_buy():
    body = plan_json(*SEED, "--box-memory", "121G", "--fit-tok-s", "16.6", "--fit-slots", "2", "--fit-checkpoint", "108G")
    alt = {p["profile"]: p["boxes"] for p in body["alternative"]}
    assert alt == {"light": 1, "moderate": 1, "intensive": 3}
    assert any("better buy" in n and "moderate 68 → 1" in n for n in body["notes"])
    human = plan(*SEED, "--box-memory", "121G", "--fit-tok-s", "16.6", "--fit-slots", "2")
    assert "Alternative: a model that fits in one box (16.6 tok/s x 2 slot(s))" in human.stdout


def test_one_box_model_not_shown_when_it_is_no_better():
    body = plan_json(*SEED, "--fit-tok-s", "0.37")
    assert body["alternative"] is None
    assert any("would not need fewer boxes" in n for n in body["notes"])


@pytest.mark.parametrize("args, message", [
    (["--tok-s", "0.37", "--profile", "a=1x1"], "the following arguments are required: --users"),
    (["--users", "50", "--profile", "a=1x1"], "one of the arguments --tok-s --tok-s-from is required"),
    (["--users", "50", "--tok-s", "0.37"], "no usage profile"),
    (["--users", "0", "--tok-s", "0.37", "--profile", "a=1x1"], "argument --users: must be larger than 0, found '0'"),
    (["--users", "-3", "--tok-s", "0.37", "--profile", "a=1x1"], "argument --users: must be larger than 0, found '-3'"),
    (["--users", "50", "--tok-s", "0", "--profile", "a=1x1"], "argument --tok-s: must be larger than 0, found '0'"),
    (["--users", "50", "--tok-s", "fast", "--profile", "a=1x1"], "argument --tok-s: expected a number, found 'fast'"),
    (["--users", "50", "--tok-s", "0.37", "--profile", "a=1x1", "--utilization", "120%"], "must be at most 100%"),
    (["--users", "50", "--tok-s", "0.37", "--profile", "a=1x1", "--hours", "-8"], "argument --hours: must be larger than 0"),
    (["--users", "50", "--tok-s", "0.37", "--profile", "moderate"], "expected NAME=REQUESTSxTOKENS"),
    (["--users", "50", "--tok-s", "0.37", "--profile", "a=0x500"], "must be larger than 0, found '0'"),
    (["--users", "50", "--tok-s", "0.37", "--requests-per-user", "5"], "--requests-per-user and --tokens-per-response go together"),
    (["--users", "50", "--tok-s", "0.37", "--profile", "a=1x1", "--checkpoint", "lots"], "argument --checkpoint: expected a size"),
    (["--users", "50", "--tok-s", "0.37", "--profile", "a=1x1", "--watts", "0"], "argument --watts: must be larger than 0"),
    (["--users", "50", "--tok-s", "0.37", "--profile", "a=1x1", "--fit-checkpoint", "10G"], "--fit-checkpoint needs --fit-tok-s"),
    (["--users", "50", "--tok-s", "0.37", "--profile", "a=1x1", "--box-memory", "121G", "--fit-tok-s", "9",
      "--fit-checkpoint", "200G"], "--fit-checkpoint is larger than --box-memory"),
])
def test_bad_inputs_exit_2_with_a_clear_error(args, message):
    out = plan(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert out.stdout == ""


class _Engine(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def engine_metrics():
    """A real HTTP server answering /metrics with an exposition the test sets (the engine itself
    does not exist yet; this is its /metrics contract)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _expose(server, tokens: float, seconds: float) -> str:
    server.RequestHandlerClass.body = (
        "# TYPE sparkd_engine_generated_tokens_total counter\n"
        f"sparkd_engine_generated_tokens_total {tokens}\n"
        "# TYPE sparkd_engine_decode_seconds_total counter\n"
        f"sparkd_engine_decode_seconds_total {seconds}\n"
    ).encode()
    return f"127.0.0.1:{server.server_address[1]}"


def test_tok_s_read_live_from_engine_metrics(engine_metrics):
    address = _expose(engine_metrics, 1110, 3000)  # 0.37 tok/s
    body = plan_json("--users", "50", "--tok-s-from", address, "--profile", "moderate=20x500")
    assert body["inputs"]["serving"]["tokens_per_second"] == pytest.approx(0.37)
    assert body["profiles"][0]["boxes"] == 68


def test_tok_s_from_an_engine_that_generated_nothing_is_a_clear_error(engine_metrics):
    address = _expose(engine_metrics, 0, 0)
    out = plan("--users", "50", "--tok-s-from", address, "--profile", "moderate=20x500")
    assert out.returncode == 1
    assert "the engine has not generated any tokens yet" in out.stderr and "or give --tok-s" in out.stderr


def test_tok_s_from_where_no_engine_listens_is_a_clear_error(engine_metrics):
    port = engine_metrics.server_address[1]
    engine_metrics.shutdown()
    engine_metrics.server_close()
    out = plan("--users", "50", "--tok-s-from", f"127.0.0.1:{port}", "--profile", "moderate=20x500")
    assert out.returncode == 1
    assert f"could not read engine metrics from http://127.0.0.1:{port}/metrics" in out.stderr
    assert "is the engine running" in out.stderr


def test_tok_s_from_something_that_is_not_an_engine(engine_metrics):
    engine_metrics.RequestHandlerClass.body = b"# TYPE other_total counter\nother_total 3\n"
    out = plan("--users", "50", "--tok-s-from", f"127.0.0.1:{engine_metrics.server_address[1]}", "--profile", "m=1x1")
    assert out.returncode == 1
    assert "could not find sparkd_engine_generated_tokens_total, sparkd_engine_decode_seconds_total" in out.stderr
