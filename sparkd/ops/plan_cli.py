"""`sparkctl plan`: arguments, reading tok/s live from an engine, and the printed tables."""

from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .engine_metrics import EngineMetricsError, decode_tokens_per_second, fetch_samples, metrics_url
from .numbers import fraction_of_one, grouped, positive_fraction, positive_int, positive_size
from .plan import TIB, Plan, PlanInputs, Profile, ProfilePlan, Serving, format_duration, make_plan, plan_dict

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

DESCRIPTION = """Size a farm of boxes for a number of users, as in the seed study's Tables 8–9.

A request occupies one slot of one box for tokens/tok-s seconds; a box gives
hours x 3600 x utilization x slots slot-seconds a day; boxes = ceil(users x requests x latency
/ that). Power, investment and storage scale with the box count (each box holds its own copy of
the checkpoint). More boxes raise throughput, never the latency of a single request.

The seed's farm (Tables 8-9):
  sparkctl plan --users 50 --tok-s 0.37 --hours 8 --utilization 70% \\
      --profile light=5x300 --profile moderate=20x500 --profile intensive=50x800 \\
      --watts 240 --price 4000 --checkpoint 539G --box-memory 121G
"""


def _profile(text: str) -> Profile:
    """argparse type: NAME=REQUESTSxTOKENS, e.g. moderate=20x500."""
    name, sep, rest = text.partition("=")
    requests, x, tokens = rest.lower().partition("x")
    if not sep or not x or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=REQUESTSxTOKENS such as moderate=20x500, found {text!r}")
    return Profile(name.strip(), positive_int(requests), positive_int(tokens))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--users", type=positive_int, required=True, help="number of users (required)")
    p.add_argument("--profile", type=_profile, action="append", default=[], metavar="NAME=REQxTOKENS",
                   help="a usage profile: requests per user per day x tokens per response (reasoning included); "
                        "repeat for several, e.g. --profile light=5x300 --profile moderate=20x500")
    p.add_argument("--requests-per-user", type=positive_int, metavar="N",
                   help="requests per user per day, for a single profile (with --tokens-per-response)")
    p.add_argument("--tokens-per-response", type=positive_int, metavar="N",
                   help="tokens per response, reasoning included, for a single profile (with --requests-per-user)")
    speed = p.add_mutually_exclusive_group(required=True)
    speed.add_argument("--tok-s", type=positive_fraction, metavar="X",
                       help="decode tokens per second of one slot of one box (the seed measured 0.37)")
    speed.add_argument("--tok-s-from", metavar="ADDRESS",
                       help="read tok/s live from a running engine's /metrics at ADDRESS (host:port or URL): "
                            "sparkd_engine_generated_tokens_total / sparkd_engine_decode_seconds_total; "
                            "fails (exit 1) when no engine answers there or it has not generated tokens yet")
    p.add_argument("--slots", type=positive_int, default=1, metavar="N",
                   help="requests one box serves at once, each at --tok-s (default 1: the seed's --parallel 1)")
    p.add_argument("--hours", type=positive_fraction, default=Fraction(8), metavar="H",
                   help="working hours a day the load falls in (default 8)")
    p.add_argument("--utilization", type=fraction_of_one, default=Fraction(7, 10), metavar="U",
                   help="target utilization of each box, 70%% or 0.7 (default 70%%: at 100%% the queue diverges)")
    p.add_argument("--watts", type=positive_fraction, metavar="W", help="power draw of one box in watts (seed: 240)")
    p.add_argument("--price", type=positive_fraction, metavar="P", help="price of one box (seed: 4000)")
    p.add_argument("--currency", default="USD", help="currency of --price (default USD)")
    p.add_argument("--checkpoint", type=positive_size, metavar="SIZE",
                   help="model checkpoint size stored on every box, e.g. 539G (binary units)")
    p.add_argument("--box-memory", type=positive_size, metavar="SIZE",
                   help="memory of one box, e.g. 121G: a checkpoint larger than this is streamed from disk")
    p.add_argument("--fit-tok-s", type=positive_fraction, metavar="X",
                   help="the alternative: tok/s of one slot of a model that fits in one box; shown when it needs fewer boxes")
    p.add_argument("--fit-slots", type=positive_int, default=1, metavar="N",
                   help="requests at once per box for the model that fits (default 1)")
    p.add_argument("--fit-checkpoint", type=positive_size, metavar="SIZE", help="checkpoint size of the model that fits")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def _profiles(args) -> tuple[Profile, ...]:
    single = (args.requests_per_user, args.tokens_per_response)
    if any(v is not None for v in single):
        if None in single:
            raise ValueError("--requests-per-user and --tokens-per-response go together; give both")
        return (*args.profile, Profile("custom", *single))
    if not args.profile:
        raise ValueError("no usage profile: give --profile NAME=REQxTOKENS, or --requests-per-user and --tokens-per-response")
    return tuple(args.profile)


def _tokens_per_second(args) -> Fraction:
    if args.tok_s is not None:
        return args.tok_s
    url = metrics_url(args.tok_s_from)
    measured = decode_tokens_per_second(fetch_samples(url), source=url)
    return Fraction(measured).limit_denominator(10**6)


def inputs_from_args(args) -> PlanInputs:
    """Validated inputs; ValueError (usage) or EngineMetricsError (live read) otherwise."""
    if args.fit_tok_s is None and args.fit_checkpoint is not None:
        raise ValueError("--fit-checkpoint needs --fit-tok-s (the speed of the model that fits)")
    if args.fit_checkpoint is not None and args.box_memory is not None and args.fit_checkpoint > args.box_memory:
        raise ValueError("--fit-checkpoint is larger than --box-memory: that model does not fit in one box")
    profiles = _profiles(args)
    fit = None
    if args.fit_tok_s is not None:
        fit = Serving(args.fit_tok_s, args.fit_slots, args.fit_checkpoint)
    return PlanInputs(
        users=args.users, profiles=profiles,
        serving=Serving(_tokens_per_second(args), args.slots, args.checkpoint),
        working_hours=args.hours, utilization=args.utilization, watts_per_box=args.watts,
        price_per_box=args.price, currency=args.currency, box_memory_bytes=args.box_memory, fits_in_one_box=fit,
    )


def _table(title: str, plans: tuple[ProfilePlan, ...], currency: str) -> Table:
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    for column in ("PROFILE", "REQ/DAY", "TOKENS", "LATENCY", "BOXES", "POWER", "INVESTMENT", "STORAGE"):
        table.add_column(column, justify="left" if column == "PROFILE" else "right")
    for p in plans:
        table.add_row(
            escape(p.profile.name), str(p.profile.requests_per_user_per_day), str(p.profile.tokens_per_response),
            format_duration(p.latency_seconds), str(p.boxes),
            "–" if p.power_watts is None else f"{float(p.power_watts) / 1000:.1f} kW",
            "–" if p.investment is None else f"{grouped(round(p.investment))} {escape(currency)}",
            "–" if p.storage_bytes is None else f"{p.storage_bytes / TIB:.1f} TiB",
        )
    return table


def render_plan(console: Console, plan: Plan) -> None:
    i = plan.inputs
    s = i.serving
    console.print(f"{i.users} users, {float(s.tokens_per_second):g} tok/s x {s.slots_per_box} slot(s) per box, "
                  f"{float(i.working_hours):g} h a day at {float(i.utilization) * 100:g}% utilization")
    console.print(_table("Boxes needed", plan.profiles, i.currency))
    if plan.alternative is not None:
        fit = i.fits_in_one_box
        console.print()
        console.print(_table(f"Alternative: a model that fits in one box ({float(fit.tokens_per_second):g} tok/s "
                             f"x {fit.slots_per_box} slot(s))", plan.alternative, i.currency))
    console.print()
    for note in plan.notes:
        console.print(f"- {escape(note)}")
    if i.watts_per_box is None or i.price_per_box is None or s.checkpoint_bytes is None:
        console.print("- power, investment and storage need --watts, --price and --checkpoint")


def run(args) -> int:
    try:
        plan = make_plan(inputs_from_args(args))
    except ValueError as exc:
        print(f"sparkctl plan: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EngineMetricsError as exc:
        print(f"sparkctl plan: {exc}; or give --tok-s", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(plan_dict(plan), indent=2))
    else:
        render_plan(Console(highlight=False), plan)
    return EXIT_OK
