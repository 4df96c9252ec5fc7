"""`sparkctl bench SERVICE`: arguments, the runs, the table, the history line."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from ..errors import SparkdError
from ..policy import DaemonPolicy
from ..sizes import format_size
from . import bench
from .numbers import positive_int

EXIT_OK, EXIT_FAILED = 0, 1
DEFAULT_STATE_DIR = DaemonPolicy().state_dir  # when sparkd does not report its own
DEFAULTS = {"prompt_tokens": 512, "gen_tokens": 128, "runs": 3}

DESCRIPTION = f"""Prompt + decode benchmark of a running embedded engine, through its OpenAI API.

sparkd's status (over the control socket) gives the service's listen address; each run streams
one /v1/completions request of exactly --prompt-tokens prompt tokens and --gen-tokens generated
tokens at temperature 0, and measures, as a client sees it: TTFT (request -> first token),
prompt tok/s (prompt tokens / TTFT) and decode tok/s ((tokens - 1) / first -> last token).
Min, median and max over --runs are printed; the result (model, budget, commit, machine) is
appended as one JSON line to STATE_DIR/{bench.HISTORY_FILE} (default: sparkd's daemon.state_dir).

Exit codes: 0 ok; 1 unknown service, not an embedded engine, not ready, an API error, or the
history not writable; 2 usage error.
"""


def add_arguments(p) -> None:
    p.add_argument("service", help="a service of sparkd's policy whose engine is embedded and ready")
    p.add_argument("--prompt-tokens", type=positive_int, default=DEFAULTS["prompt_tokens"], metavar="N",
                   help=f"prompt length in tokens (default {DEFAULTS['prompt_tokens']})")
    p.add_argument("--gen-tokens", type=positive_int, default=DEFAULTS["gen_tokens"], metavar="N",
                   help=f"tokens to generate per run (default {DEFAULTS['gen_tokens']})")
    p.add_argument("--runs", type=positive_int, default=DEFAULTS["runs"], metavar="N",
                   help=f"requests, one after another (default {DEFAULTS['runs']})")
    p.add_argument("--api-key", metavar="KEY", help="bearer key (default: the key in the service's engine.embedded.api_key_file, when set)")
    p.add_argument("--state-dir", type=Path, metavar="DIR",
                   help="where the history is appended (default: sparkd's daemon.state_dir)")
    p.add_argument("--no-save", action="store_true", help="do not append to the history")
    p.add_argument("--json", action="store_true", help="print the record (the history line) as JSON")


def _measure(args, target: bench.Target) -> dict:
    key = bench.api_key(target, args.api_key)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(headers=headers) as http:
            model = bench.served_model(http, target.url)
            budget = bench.engine_budget_bytes(http, target.url)
            runs = [bench.run_once(http, target.url, model, args.prompt_tokens, args.gen_tokens)
                    for _ in range(args.runs)]
    except httpx.HTTPError as exc:
        raise bench.BenchError(f"could not talk to {args.service}'s engine at {target.url}: "
                               f"{exc or type(exc).__name__}") from exc
    summary = {key: bench.spread([r[key] for r in runs])
               for key in ("ttft_seconds", "prompt_tokens_per_second", "decode_tokens_per_second")}
    return {"time": time.time(), "service": target.service, "url": target.url, "model": model,
            "budget_bytes": budget, "memory_max_bytes": target.memory_max_bytes, "commit": bench.commit_id(),
            "machine": bench.machine(), "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
            "runs": runs, **summary}


def _number(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def render(console: Console, record: dict) -> None:
    budget = record["budget_bytes"] or record["memory_max_bytes"]
    console.print(f"{record['service']}: model {record['model']} at {record['url']}, budget "
                  f"{format_size(budget) if budget else '–'}, {len(record['runs'])} run(s) of "
                  f"{record['prompt_tokens']} prompt + {record['gen_tokens']} generated tokens")
    table = Table(box=None, pad_edge=False)
    for name in ("", "MIN", "MEDIAN", "MAX"):
        table.add_column(name, justify="left" if not name else "right")
    for label, key, digits in (("prompt tok/s", "prompt_tokens_per_second", 2),
                               ("decode tok/s", "decode_tokens_per_second", 2), ("TTFT s", "ttft_seconds", 3)):
        s = record[key]
        table.add_row(label, *(_number(s[k], digits) for k in ("min", "median", "max")))
    console.print(table)
    m = record["machine"]
    console.print(f"commit {record['commit']} · {m['hostname']} · {m['cpu']} x{m['cpu_count']} · "
                  f"{format_size(m['memory_total_bytes']) if m['memory_total_bytes'] else '–'}")


def run(args, fetch_status: Callable[[], dict]) -> int:
    console = Console(highlight=False)
    try:
        status = fetch_status()
        target = bench.find_target(status, args.service)
        record = _measure(args, target)
        state_dir = args.state_dir or Path(status["daemon"].get("state_dir") or DEFAULT_STATE_DIR)
        if not args.no_save:
            history = state_dir / bench.HISTORY_FILE
            bench.append_history(history, record)
    except SparkdError as exc:
        print(f"sparkctl bench: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        render(console, record)
        if not args.no_save:
            console.print(f"appended to {history}")
    return EXIT_OK
