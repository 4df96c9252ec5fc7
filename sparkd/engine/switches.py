"""The engine's environment switches (SPARKD_*, docs/engine.md's table), read one way.

Each switch takes a fixed set of values and refuses any other with the variable, the value and
the values it takes, so a typo stops the run instead of silently keeping the default. Unset means
the default; a value is matched after stripping blanks and lowering its case. The caller decides
when a switch is read (at import, or per call) by where it calls these.

- flag: on/off; "1" or "on", "0" or "off".
- choice: one name of a list.
- names: a set of parts, "all", "none" (or empty) or some of them separated by commas; parse_names
  is the same for a value handed over in code (fused.configure, a bench's --moe-decode).
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from sparkd.engine.errors import EngineError

ON = ("1", "on")
OFF = ("0", "off")


class SwitchError(EngineError, ValueError):
    """An environment switch (or the same choice handed over in code) has a value it does not take."""


def _value(name: str, env: Mapping[str, str] | None) -> str | None:
    value = (os.environ if env is None else env).get(name)
    return None if value is None else value.strip().lower()


def flag(name: str, default: bool, env: Mapping[str, str] | None = None) -> bool:
    """$name as on/off (ON, OFF); unset: default. env replaces os.environ (tests)."""
    value = _value(name, env)
    if value is None:
        return default
    if value not in ON + OFF:
        raise SwitchError(f"could not use {name}={value!r}: choose one of {', '.join(ON + OFF)} "
                          f"(unset: {ON[0] if default else OFF[0]})")
    return value in ON


def choice(name: str, allowed: Sequence[str], default: str, env: Mapping[str, str] | None = None) -> str:
    """$name, one of allowed; unset: default. env replaces os.environ (tests)."""
    value = _value(name, env)
    if value is None:
        return default
    if value not in allowed:
        raise SwitchError(f"could not use {name}={value!r}: choose one of {', '.join(allowed)} (unset: {default})")
    return value


def names(name: str, allowed: Sequence[str], what: str, default: str = "all",
          env: Mapping[str, str] | None = None) -> frozenset[str]:
    """$name as a set of allowed parts (parse_names); unset: default. what names the parts in errors."""
    value = _value(name, env)
    return parse_names(default if value is None else value, allowed, what, name)


def parse_names(spec: str, allowed: Sequence[str], what: str, name: str) -> frozenset[str]:
    """"all", "none"/"" or parts of allowed separated by commas → the parts switched on; the error
    names `what` (e.g. "fused kernels") and the variable that sets them (name)."""
    spec = spec.strip().lower()
    if spec == "all":
        return frozenset(allowed)
    parts = {n.strip() for n in spec.split(",") if n.strip() not in ("", "none")}
    if unknown := sorted(parts - set(allowed)):
        raise SwitchError(f"could not switch {what} {spec!r}: unknown {', '.join(unknown)} "
                          f"(choose all, none or some of {', '.join(allowed)}; {name})")
    return frozenset(parts)
