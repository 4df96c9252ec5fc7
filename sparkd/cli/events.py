"""`sparkctl events`: print the watchers' events, and with --follow keep printing new ones.

--follow long-polls GET /v1/events?after=SEQ&wait=...; when sparkd goes away (a restart) it
waits and resumes after the last sequence number it printed, so nothing is skipped or repeated.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import datetime

from ..errors import ControlError

# Long-poll length; sparkd answers at least this often (control.MAX_EVENTS_WAIT_SECONDS caps it).
FOLLOW_WAIT_SECONDS = 25.0
# While sparkd is away (restarting), ask again this often.
RECONNECT_SECONDS = 1.0
_AGE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_AGE_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """Unix time from '1764583200', '2026-12-01T10:00' (local time) or an age such as '10m'."""
    now = time.time() if now is None else now
    m = _AGE.match(text.strip())
    if m:
        return now - float(m.group(1)) * _AGE_SECONDS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"could not read --since {text!r}: expected unix time, ISO time (2026-12-01T10:00) or an age (10m, 2h)"
        ) from None


def format_event(event: dict) -> str:
    when = datetime.fromtimestamp(event.get("time", 0)).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    parts = [when, f"#{event.get('seq')}", event.get("type", "?")]
    for key in ("service", "detector", "rule"):
        if event.get(key):
            parts.append(f"{key}={event[key]}")
    action = event.get("action")
    if action:
        parts.append("action=" + (",".join(action) if isinstance(action, list) else str(action)))
    if event.get("dry_run"):
        parts.append("(dry run)")
    if event.get("result"):
        parts.append(f"— {event['result']}")
    return " ".join(str(p) for p in parts)


def _print(events: list[dict], as_json: bool) -> None:
    for event in events:
        print(json.dumps(event) if as_json else format_event(event), flush=True)


def _fetch(client, after: int, since: float | None, wait_seconds: float) -> list[dict]:
    params: dict = {"after": after}
    if since is not None:
        params["since"] = since
    if wait_seconds:
        params["wait"] = wait_seconds
    code, body = client.call("GET", "/v1/events", wait_seconds + 30.0, params)
    if code >= 400:
        raise ControlError(body.get("error", {}).get("message", f"HTTP {code}"))
    return body["events"]


def show_events(client, args) -> int:
    try:
        events = _fetch(client, 0, args.since, 0)
    except ControlError as exc:
        print(f"sparkctl: {exc}", file=sys.stderr)
        return 1
    _print(events, args.json)
    if not args.follow:
        return 0
    after = events[-1]["seq"] if events else 0
    try:
        while True:
            try:
                events = _fetch(client, after, None, FOLLOW_WAIT_SECONDS)
            except ControlError as exc:
                print(f"sparkctl: {exc}; retrying", file=sys.stderr)
                time.sleep(RECONNECT_SECONDS)
                continue
            _print(events, args.json)
            if events:
                after = events[-1]["seq"]
    except KeyboardInterrupt:
        return 0
