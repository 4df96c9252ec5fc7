"""sparkctl: talk to sparkd over its control socket.

  sparkctl [--socket PATH] status [--json]
  sparkctl [--socket PATH] start NAME
  sparkctl [--socket PATH] stop NAME
  sparkctl [--socket PATH] preflight [NAME] [--json]
  sparkctl check-policy FILE [--json]          (local; needs no sparkd)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx
from rich.console import Console

from ..errors import ControlError
from .common import check_policy
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
    sub = p.add_subparsers(dest="command", required=True, metavar="{status,start,stop,preflight,check-policy}")
    status = sub.add_parser("status", help="services, memory, pressure, guards")
    status.add_argument("--json", action="store_true")
    for verb in ("start", "stop"):
        cmd = sub.add_parser(verb, help=f"{verb} a service of the policy")
        cmd.add_argument("name")
        cmd.add_argument("--json", action="store_true")
    pre = sub.add_parser("preflight", help="run the start guards without starting (all services if no NAME)")
    pre.add_argument("name", nargs="?")
    pre.add_argument("--json", action="store_true")
    check = sub.add_parser("check-policy", help="validate a policy file and print it resolved")
    check.add_argument("file", type=Path)
    check.add_argument("--json", action="store_true")
    return p


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
    console = Console(highlight=False)
    try:
        code, body = _request(Client(args.socket), args)
    except ControlError as exc:
        print(f"sparkctl: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return _show(console, args, code, body)


if __name__ == "__main__":
    sys.exit(main())
