"""sparkctl: talk to sparkd over its control socket.

  sparkctl [--socket PATH] status [--json]
  sparkctl [--socket PATH] start NAME
  sparkctl [--socket PATH] stop NAME
  sparkctl [--socket PATH] preflight [NAME] [--json]
  sparkctl [--socket PATH] events [--follow] [--since WHEN] [--json]
  sparkctl [--socket PATH] clear [NAME]
  sparkctl check-policy FILE [--json]          (local; needs no sparkd)
  sparkctl plan --users N --tok-s X --profile NAME=REQxTOKENS ...   (local)
  sparkctl disk-bench PATH [--size 4G] [--json] ...                 (local)
  sparkctl [--socket PATH] top [--once] [--interval S]
  sparkctl [--socket PATH] bench SERVICE [--prompt-tokens N] [--gen-tokens N] [--runs N] [--json] ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx
from rich.console import Console

from ..errors import ControlError
from ..ops import bench_cli, diskbench_cli, plan_cli, top
from .common import check_policy
from .events import parse_since, show_events
from .render import render_action, render_preflight, render_refusal, render_status

DEFAULT_SOCKET = Path("/run/sparkd/control.sock")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# start/stop wait for the guards (a competitor may take its term_timeout to stop) and for
# stop_timeout; a status answers at once.
_TIMEOUT_SECONDS = {"status": 30.0, "preflight": 120.0, "start": 600.0, "stop": 600.0}

EPILOG = """exit codes:
  0  ok
  1  refused by the start guards, or failed (sparkd unreachable, service failed, invalid policy)
  2  usage error
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sparkctl", description="Control sparkd over its unix socket.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", type=Path, default=DEFAULT_SOCKET, help=f"control socket (default {DEFAULT_SOCKET})")
    sub = p.add_subparsers(dest="command", required=True,
                           metavar="{status,start,stop,preflight,events,clear,check-policy,plan,disk-bench,top,bench}")
    status = sub.add_parser("status", help="services, memory, pressure, guards")
    status.add_argument("--json", action="store_true")
    for verb in ("start", "stop"):
        cmd = sub.add_parser(verb, help=f"{verb} a service of the policy")
        cmd.add_argument("name")
        cmd.add_argument("--json", action="store_true")
    pre = sub.add_parser("preflight", help="run the start guards without starting (all services if no NAME)")
    pre.add_argument("name", nargs="?")
    pre.add_argument("--json", action="store_true")
    events = sub.add_parser("events", help="what the watchers detected and did (oldest first)")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events (survives a sparkd restart)")
    events.add_argument("--since", type=parse_since, help="unix time, ISO time (2026-12-01T10:00) or an age (10m, 2h)")
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    clear = sub.add_parser("clear", help="lift the watchers' start holds (of NAME, or all)")
    clear.add_argument("name", nargs="?")
    clear.add_argument("--json", action="store_true")
    check = sub.add_parser("check-policy", help="validate a policy file and print it resolved")
    check.add_argument("file", type=Path)
    check.add_argument("--json", action="store_true")
    _add_ops(sub)
    return p


_LOCAL_OPS = {"plan": plan_cli.run, "disk-bench": diskbench_cli.run}


def _add_ops(sub) -> None:
    plan_cli.add_arguments(sub.add_parser(
        "plan", help="size a farm of boxes for N users (the seed's Tables 8-9)", description=plan_cli.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter))
    diskbench_cli.add_arguments(sub.add_parser(
        "disk-bench", help="O_DIRECT read bandwidth by block size x queue depth", description=diskbench_cli.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter))
    top.add_arguments(sub.add_parser("top", help="live view of services, memory, pressure (q quits)", description=top.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter))
    bench_cli.add_arguments(sub.add_parser(
        "bench", help="prompt + decode benchmark of a running embedded engine (OpenAI API)",
        description=bench_cli.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter))


def _status_fetcher(socket_path: Path):
    client = Client(socket_path)

    def fetch() -> dict:
        code, body = client.call("GET", "/v1/status", _TIMEOUT_SECONDS["status"])
        if code >= 400:
            raise ControlError(f"could not get sparkd's status: {body.get('error', {}).get('message', f'HTTP {code}')}")
        return body
    return fetch


def _top_fetcher(socket_path: Path):
    """Status plus the last events (GET /v1/events?limit=N answers the newest N)."""
    fetch_status, client = _status_fetcher(socket_path), Client(socket_path)

    def fetch() -> dict:
        status = fetch_status()
        code, body = client.call("GET", "/v1/events", _TIMEOUT_SECONDS["status"], {"limit": top.EVENTS_SHOWN})
        if code >= 400:
            status["events_reason"] = body.get("error", {}).get("message", f"HTTP {code}")
        else:
            status["events"] = body["events"]
        return status
    return fetch


def _os_cause(exc: BaseException) -> str:
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror.lower()
        seen = seen.__cause__ or seen.__context__
    return str(exc)


class Client:
    def __init__(self, socket_path: Path):
        self.socket_path = socket_path
        self._http = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://sparkd")

    def call(self, method: str, path: str, timeout_seconds: float, params: dict | None = None) -> tuple[int, dict]:
        try:
            response = self._http.request(method, path, params=params, timeout=timeout_seconds)
        except httpx.TransportError as exc:
            cause = _os_cause(exc)
            hint = "is sparkd running?"
            if "permission" in cause:
                hint = "run as root or as a member of daemon.socket_group"
            raise ControlError(f"could not connect to sparkd at {self.socket_path}: {cause}; {hint}") from exc
        try:
            return response.status_code, response.json()
        except ValueError as exc:
            raise ControlError(f"could not read sparkd's answer to {method} {path}: not JSON (HTTP {response.status_code})") from exc


def _request(client: Client, args) -> tuple[int, dict]:
    if args.command == "clear":
        params = {"service": args.name} if args.name else None
        return client.call("POST", "/v1/clear", _TIMEOUT_SECONDS["status"], params)
    if args.command == "status":
        return client.call("GET", "/v1/status", _TIMEOUT_SECONDS["status"])
    if args.command == "preflight":
        params = {"service": args.name} if args.name else None
        return client.call("GET", "/v1/preflight", _TIMEOUT_SECONDS["preflight"], params)
    return client.call("POST", f"/v1/services/{args.name}/{args.command}", _TIMEOUT_SECONDS[args.command])


def _show(console: Console, args, code: int, body: dict) -> int:
    if args.json:
        print(json.dumps(body, indent=2))
    elif "error" in body:
        render_refusal(console, body["error"])
    elif args.command == "status":
        render_status(console, body)
    elif args.command == "preflight":
        render_preflight(console, body)
    else:
        render_action(console, body)
    if code >= 400 or (args.command == "preflight" and body.get("refused")):
        return EXIT_FAILED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check-policy":
        return check_policy(args.file, as_json=args.json)
    if args.command in _LOCAL_OPS:
        return _LOCAL_OPS[args.command](args)
    if args.command == "top":
        return top.run(args, _top_fetcher(args.socket))
    if args.command == "bench":
        return bench_cli.run(args, _status_fetcher(args.socket))
    if args.command == "events":
        return show_events(Client(args.socket), args)
    console = Console(highlight=False)
    try:
        code, body = _request(Client(args.socket), args)
    except ControlError as exc:
        print(f"sparkctl: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return _show(console, args, code, body)


if __name__ == "__main__":
    sys.exit(main())
