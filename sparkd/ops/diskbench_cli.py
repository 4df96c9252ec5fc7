"""`sparkctl disk-bench`: arguments, the measurement loop with progress and clean-up, the table,
and the result file the engine's streaming reads (state_dir/disk-bench.json)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ..policy import DaemonPolicy
from ..sizes import format_size
from .diskbench import (DEFAULT_BLOCK_BYTES, DEFAULT_QUEUE_DEPTHS, DiskBenchError, Interrupted, Measurement, Target,
                        best_of, fill_temp_file, measure, open_for_read, prepare_target, remove_temp_file)
from .numbers import positive_fraction, positive_int, positive_size

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
RESULT_FILE = "disk-bench.json"
DEFAULT_STATE_DIR = DaemonPolicy().state_dir
EXIT_INTERRUPTED = 130
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

DESCRIPTION = f"""O_DIRECT read bandwidth by block size x queue depth.

PATH is an existing large file (or block device), read without writing it, or a directory, where
a temporary file of --size is written and removed afterwards (also on Ctrl-C, SIGTERM, SIGHUP or
an error). Reads bypass the page cache, so nothing is dropped from other processes' caches. Where
the filesystem refuses O_DIRECT the tool says so loudly and measures buffered reads instead.

The best configuration is saved to STATE_DIR/{RESULT_FILE} (default state dir
{DEFAULT_STATE_DIR}), where the engine's expert streaming reads its bandwidth bound.
"""


def _csv(item_type):
    def parse(text: str) -> tuple:
        items = [item_type(part) for part in text.split(",") if part.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, found {text!r}")
        return tuple(sorted(set(items)))
    return parse


def _block_size(text: str) -> int:
    value = positive_size(text)
    if value % 4096:
        raise argparse.ArgumentTypeError(f"block sizes must be multiples of 4K (O_DIRECT alignment), found {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, help="an existing large file or block device to read, or a directory for a temporary file")
    p.add_argument("--size", type=positive_size, default=positive_size("4G"), metavar="SIZE",
                   help="bytes to read from (or write to) PATH, e.g. 1G (default 4G; an existing file is read up to its size)")
    p.add_argument("--block-sizes", type=_csv(_block_size), default=DEFAULT_BLOCK_BYTES, metavar="LIST",
                   help="comma-separated block sizes, multiples of 4K (default 128K,256K,512K,1M,2M,4M,8M,16M)")
    p.add_argument("--queue-depths", type=_csv(positive_int), default=DEFAULT_QUEUE_DEPTHS, metavar="LIST",
                   help="comma-separated reads in flight (default 1,2,4,8,16,32,64)")
    p.add_argument("--seconds", type=positive_fraction, default=positive_fraction("1"), metavar="S",
                   help="seconds per configuration (default 1)")
    p.add_argument("--pattern", choices=("random", "sequential"), default="random",
                   help="offsets: random block-aligned, like expert reads (default), or sequential, like dd")
    p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, metavar="DIR",
                   help=f"where {RESULT_FILE} is written (default {DEFAULT_STATE_DIR}, sparkd's daemon.state_dir)")
    p.add_argument("--no-save", action="store_true", help=f"do not write {RESULT_FILE}")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event):
    """Ctrl-C, SIGTERM and SIGHUP (an SSH drop) ask the loops to stop; they then clean up."""
    def handler(signum, frame):
        stop.set()
    previous = {s: signal.signal(s, handler) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _progress(enabled: bool) -> Progress:
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn())
    return Progress(*columns, console=Console(stderr=True), transient=True, disable=not enabled)


def _measure_all(target: Target, args, stop: threading.Event, progress: Progress) -> list[Measurement]:
    if target.temporary:
        task = progress.add_task(f"writing {format_size(target.region_bytes)} test file", total=target.region_bytes)
        fill_temp_file(target, lambda done: progress.update(task, completed=done), stop)
        progress.remove_task(task)
    fd = open_for_read(target)
    try:
        configs = [(b, q) for b in args.block_sizes for q in args.queue_depths]
        task = progress.add_task("measuring", total=len(configs))
        results = []
        for block, depth in configs:
            progress.update(task, description=f"{format_size(block)} x QD {depth}")
            results.append(measure(fd, target, block, depth, float(args.seconds), args.pattern, stop))
            progress.advance(task)
        return results
    finally:
        os.close(fd)


def result_record(target: Target, args, results: list[Measurement]) -> dict:
    return {
        "path": str(target.path), "temporary_file": target.temporary, "filesystem": target.filesystem,
        "mode": target.mode, "pattern": args.pattern, "region_bytes": target.region_bytes,
        "seconds_per_config": float(args.seconds), "warnings": target.warnings,
        "results": [m.to_dict() for m in results], "best": best_of(results).to_dict(),
        "measured_at": time.time(), "hostname": socket.gethostname(),
    }


def save_record(record: dict, state_dir: Path) -> Path:
    """Atomically replace state_dir/disk-bench.json (a reader never sees half a file)."""
    path = state_dir / RESULT_FILE
    tmp = path.with_name(f".{RESULT_FILE}.{os.getpid()}.tmp")
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise DiskBenchError(f"could not save the result to {path}: {exc.strerror}; run as root or pass --state-dir") from exc
    return path


def render(console: Console, record: dict) -> None:
    console.print(f"{escape(record['path'])} ({record['filesystem'] or 'unknown fs'}), {format_size(record['region_bytes'])}, "
                  f"{record['mode']} {record['pattern']} reads, {record['seconds_per_config']:g} s each; MB/s:")
    for warning in record["warnings"]:
        console.print(f"[bold red]WARNING: {escape(warning)}[/]")
    depths = sorted({r["queue_depth"] for r in record["results"]})
    table = Table(box=None, pad_edge=False)
    table.add_column("BLOCK", justify="right")
    for d in depths:
        table.add_column(f"QD {d}", justify="right")
    best = record["best"]
    for block in sorted({r["block_bytes"] for r in record["results"]}):
        cells = {r["queue_depth"]: r for r in record["results"] if r["block_bytes"] == block}
        row = [f"[bold]{cells[d]['mb_per_second']:.0f}[/]" if cells[d] == best else f"{cells[d]['mb_per_second']:.0f}" for d in depths]
        table.add_row(format_size(block), *row)
    console.print(table)
    console.print(f"best: {format_size(best['block_bytes'])} blocks x queue depth {best['queue_depth']}: "
                  f"{best['mb_per_second']:.0f} MB/s")
    if record.get("saved_to"):
        console.print(f"saved to {escape(record['saved_to'])}")


def run(args) -> int:
    stop = threading.Event()
    target = None
    with _stop_on_signals(stop):
        try:
            target = prepare_target(args.path, args.size, max(args.block_sizes))
            with _progress(sys.stderr.isatty()) as progress:
                results = _measure_all(target, args, stop, progress)
        except Interrupted:
            print("sparkctl disk-bench: interrupted; nothing saved", file=sys.stderr)
            return EXIT_INTERRUPTED
        except DiskBenchError as exc:
            print(f"sparkctl disk-bench: {exc}", file=sys.stderr)
            return EXIT_FAILED
        finally:
            remove_temp_file(target)
    record = result_record(target, args, results)
    saved_to = None
    if not args.no_save:
        try:
            saved_to = str(save_record(record, args.state_dir))
        except DiskBenchError as exc:
            print(f"sparkctl disk-bench: warning: {exc}", file=sys.stderr)
    record["saved_to"] = saved_to
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        render(Console(highlight=False), record)
    return EXIT_OK
