"""`sparkctl top`: a live view of sparkd's status that fits an 80x24 terminal over SSH.

It draws what GET /v1/status returns: per service state, memory.current vs max, PSI avg10, GPU
memory, and for an embedded engine what sparkd's probe read from its /metrics (svc["engine"]:
decode_tok_s, requests_queued, cache_retention 0..1, disk_read_bytes_per_second; the cache and
disk figures exist only with expert streaming); the box's MemAvailable vs the guards' reserve;
the last events of GET /v1/events (status["events"], added by the fetcher). Any figure missing
shows '–'.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import time
import tty
from collections.abc import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..errors import SparkdError
from ..sizes import format_size
from .numbers import positive_fraction

NA = "–"
EVENTS_SHOWN = 4
# Lines that are not service rows: header (up to 4), blank, table header, blank, events title,
# events, footer. The rest of the terminal's height is for services.
_FIXED_LINES = 4 + 1 + 1 + 1 + 1 + EVENTS_SHOWN + 1
QUIT_KEYS = ("q", "Q")


def _size(n: int | None) -> str:
    return NA if n is None else format_size(n)


def _line(text: str, style: str = "") -> Text:
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")


def _uptime(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 1440}d{minutes // 60 % 24:02d}h" if minutes >= 1440 else f"{minutes // 60}h{minutes % 60:02d}m"


def _header(status: dict, now: float) -> list[Text]:
    d = status["daemon"]
    lines = [_line(f"sparkd pid {d['pid']} · {d['placement']} · up {_uptime(now - d['started_at'])} · "
                   f"{time.strftime('%H:%M:%S', time.localtime(now))}", "bold")]
    mem = status.get("system")
    if mem is None or mem.get("mem_available_bytes") is None:
        why = (mem or {}).get("reason") or "this sparkd does not report it"
        lines.append(_line(f"MemAvailable {NA} ({why})"))
    else:
        available, reserve = mem["mem_available_bytes"], mem["reserve_bytes"]
        below = available < reserve
        margin = f"BELOW reserve by {_size(reserve - available)}" if below else f"above reserve {_size(available - reserve)}"
        lines.append(_line(f"MemAvailable {_size(available)} of {_size(mem['mem_total_bytes'])} · reserve {_size(reserve)}"
                           f" · {margin}", "bold red" if below else ""))
    if not d["memory_enforced"]:
        lines.append(_line(f"memory limits NOT enforced: {d.get('why_not_enforced') or 'no memory controller'}", "yellow"))
    if not d.get("gpu_available"):
        lines.append(_line(f"GPU {NA}: {d.get('gpu_reason') or 'NVML unavailable'}"))
    return lines


def _pct(value: float | None) -> str:
    return NA if value is None else f"{value:.1f}"


def _engine_cells(engine: dict) -> list[str]:
    tok_s = engine.get("decode_tok_s")
    queued = engine.get("requests_queued")
    retention = engine.get("cache_retention")
    disk = engine.get("disk_read_bytes_per_second")
    return [NA if tok_s is None else f"{tok_s:.2f}", NA if queued is None else str(queued),
            NA if retention is None else f"{retention * 100:.0f}%", NA if disk is None else f"{disk / 1e6:.0f}"]


def _service_row(svc: dict) -> list[str]:
    limit = svc.get("memory_max_bytes") or svc.get("memory_max_policy_bytes")
    some, full = svc.get("psi_some_avg10"), svc.get("psi_full_avg10")
    psi = NA if some is None and full is None else f"{_pct(some)}/{_pct(full)}"
    gpu = NA if svc.get("gpu_mib") is None else f"{svc['gpu_mib']}M"
    return [svc["name"], svc["state"], f"{_size(svc.get('memory_current_bytes'))}/{_size(limit)}", psi, gpu,
            *_engine_cells(svc.get("engine") or {})]


def _services(status: dict, max_rows: int) -> Table:
    table = Table(box=None, pad_edge=False, expand=False)
    widths = {"SERVICE": 12, "STATE": 10, "MEM cur/max": 13, "PSI s/f": 9, "GPU": 6,
              "TOK/S": 6, "QUEUE": 5, "CACHE": 5, "DISK MB/s": 9}
    for name, width in widths.items():
        table.add_column(name, max_width=width, no_wrap=True, overflow="ellipsis",
                         justify="left" if name in ("SERVICE", "STATE") else "right")
    services = status["services"]
    shown = services if len(services) <= max_rows else services[: max(max_rows - 1, 0)]
    for svc in shown:
        style = "red" if svc["state"] == "failed" else ("green" if svc["state"] == "active" else "")
        table.add_row(*_service_row(svc), style=style)
    if len(shown) < len(services):
        table.add_row(f"… {len(services) - len(shown)} more", *[""] * (len(widths) - 1))
    if not services:
        table.add_row("(no services)", *[""] * (len(widths) - 1))
    return table


def _event_line(e: dict) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(e.get("time", 0)))
    what = e.get("result") or e.get("detector") or ""
    return f"{stamp} {e.get('service') or '-'} {e.get('type', '?')}" + (f": {what}" if what else "")


def _events(status: dict) -> list[Text]:
    events = status.get("events")
    if events is None:
        why = status.get("events_reason") or "this sparkd does not report events"
        return [_line(f"events {NA} ({why})", "dim")]
    lines = [_line("last events", "bold")]
    lines += [_line(_event_line(e)) for e in events[-EVENTS_SHOWN:]]
    if not events:
        lines.append(_line("(none)", "dim"))
    return lines


def render_frame(status: dict | None, error: str | None, *, now: float, height: int,
                 interval_seconds: float | None = None) -> Group:
    """One screen: header, services, events, footer (live view only); never taller than `height` lines."""
    footer = _line("" if interval_seconds is None else f"q quit · every {interval_seconds:g} s", "dim")
    if status is None:
        return Group(_line(f"sparkd: {error}", "bold red"), footer)
    header = _header(status, now)
    parts: list = [*header]
    if error:
        parts.append(_line(f"refresh failed: {error} (showing the last answer)", "red"))
    rows = max(height - _FIXED_LINES - (1 if error else 0), 1)
    parts += [_line(""), _services(status, rows), _line(""), *_events(status), footer]
    return Group(*parts)


class KeyReader:
    """Single key presses from a terminal (cbreak mode, restored on exit); no-op when not a tty."""

    def __init__(self, fd: int):
        self.fd = fd
        self._saved = None

    def __enter__(self) -> "KeyReader":
        if os.isatty(self.fd):
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def wait(self, timeout_seconds: float) -> str | None:
        """A key pressed within timeout_seconds, or None."""
        if self._saved is None:
            time.sleep(timeout_seconds)
            return None
        ready, _, _ = select.select([self.fd], [], [], timeout_seconds)
        return os.read(self.fd, 1).decode(errors="replace") if ready else None


def _poll(fetch: Callable[[], dict], last: dict | None) -> tuple[dict | None, str | None]:
    try:
        return fetch(), None
    except SparkdError as exc:
        return last, str(exc)


def _raise_exit(signum, frame):
    raise SystemExit(0)


def run_live(fetch: Callable[[], dict], console: Console, *, interval_seconds: float, input_fd: int) -> int:
    status: dict | None = None
    previous = signal.signal(signal.SIGTERM, _raise_exit)  # so the terminal is restored on SIGTERM
    try:
        with KeyReader(input_fd) as keys, Live(console=console, screen=True, auto_refresh=False) as live:
            while True:
                status, error = _poll(fetch, status)
                live.update(render_frame(status, error, now=time.time(), height=console.size.height,
                                         interval_seconds=interval_seconds), refresh=True)
                deadline = time.monotonic() + interval_seconds
                while (left := deadline - time.monotonic()) > 0:
                    if keys.wait(left) in QUIT_KEYS:
                        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_once(fetch: Callable[[], dict], console: Console) -> int:
    status, error = _poll(fetch, None)
    if error:
        print(f"sparkctl top: {error}", file=sys.stderr)
        return 1
    console.print(render_frame(status, None, now=time.time(), height=console.size.height))
    return 0


def run(args, fetch: Callable[[], dict]) -> int:
    console = Console(highlight=False)
    if args.once:
        return run_once(fetch, console)
    if not console.is_terminal:
        print("sparkctl top: needs a terminal; use --once (or status --json) in scripts", file=sys.stderr)
        return 2
    with contextlib.suppress(BrokenPipeError):
        return run_live(fetch, console, interval_seconds=float(args.interval), input_fd=sys.stdin.fileno())
    return 0


def add_arguments(p) -> None:
    p.add_argument("--once", action="store_true", help="print one frame and exit (for scripts and tests); exit 1 if sparkd is unreachable")
    p.add_argument("--interval", type=positive_fraction, default=positive_fraction("2"), metavar="S",
                   help="seconds between refreshes (default 2)")
