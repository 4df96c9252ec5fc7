"""Command-line number types shared by the operator tools: exact decimals, sizes, percentages.

Inputs are parsed into Fractions so that planning arithmetic is exact: 0.37 tok/s is 37/100, and
a box count that lands on a whole number is not pushed over it by binary rounding.
"""

from __future__ import annotations

import argparse
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from ..sizes import parse_size


def positive_fraction(text: str) -> Fraction:
    """argparse type: a number larger than 0 ('0.37', '240', '1e3')."""
    try:
        value = Fraction(Decimal(text.strip()))
    except (InvalidOperation, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number, found {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be larger than 0, found {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, found {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be larger than 0, found {text!r}")
    return value


def fraction_of_one(text: str) -> Fraction:
    """argparse type: '70%' or '0.7', in (0, 1]."""
    raw = text.strip()
    scale = Fraction(1, 100) if raw.endswith("%") else Fraction(1)
    value = positive_fraction(raw.removesuffix("%")) * scale
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be at most 100% (1.0), found {text!r}")
    return value


def positive_size(text: str) -> int:
    """argparse type: bytes from '539G', '1.5T', '4096' (binary units); larger than 0."""
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be larger than 0, found {text!r}")
    return value


def grouped(n: int) -> str:
    """44000 -> '44 000' (the seed's tables group thousands with a space)."""
    return f"{n:,}".replace(",", " ")
