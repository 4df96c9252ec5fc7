"""`sparkd [--policy FILE] [run]`: the supervisor in the foreground (what systemd runs).
`sparkd check-policy FILE [--json]`: validate a policy and print it resolved.

Exit codes: 0 ok, 1 invalid policy or failed start-up, 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from ..errors import SparkdError
from ..logfmt import setup_logging, stderr_is_journal
from ..notify import Notifier
from ..policy import DEFAULT_POLICY_PATH
from .common import check_policy, read_policy


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sparkd",
        description="Supervisor that places MoE engines in memory-limited cgroups, guards their starts "
        "and serves sparkctl on a unix socket.",
        epilog="exit codes: 0 ok, 1 invalid policy or failed start-up, 2 usage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--policy", type=Path, default=DEFAULT_POLICY_PATH, help=f"policy file (default {DEFAULT_POLICY_PATH})")
    sub = p.add_subparsers(dest="command", metavar="{run,check-policy}")
    sub.add_parser("run", help="run in the foreground (default)")
    check = sub.add_parser("check-policy", help="validate a policy file and print it resolved")
    check.add_argument("file", type=Path)
    check.add_argument("--json", action="store_true", help="print the resolved policy as JSON")
    return p


def _run(policy_path: Path) -> int:
    setup_logging(journal=stderr_is_journal(os.environ.get("JOURNAL_STREAM")))
    try:
        policy = read_policy(policy_path)
        from ..daemon import run_daemon
        from ..guards import preflight

        asyncio.run(run_daemon(policy, preflight=preflight, notifier=Notifier.from_environ(dict(os.environ))))
    except SparkdError as exc:
        print(f"sparkd: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check-policy":
        return check_policy(args.file, as_json=args.json)
    return _run(args.policy)


if __name__ == "__main__":
    sys.exit(main())
