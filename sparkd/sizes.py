"""Byte sizes as people write them in policies and on command lines: 92G, 512M, 1.5T, 80%."""

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:i?B)?\s*$", re.IGNORECASE)
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_size(text: str | int, *, total_bytes: int | None = None) -> int:
    """Bytes for '92G', '512M', '4096', '1.5T' (binary units, as systemd reads them) or '80%'
    of total_bytes. Raises ValueError with the accepted forms."""
    if isinstance(text, bool):
        raise ValueError(f"expected a size such as 92G, 512M or 80%, found {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size cannot be negative, found {text}")
        return text
    m = _SIZE.match(str(text))
    if m:
        return int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    m = _PERCENT.match(str(text))
    if m:
        if total_bytes is None:
            raise ValueError(f"a percentage ({text!r}) needs the physical memory size")
        pct = float(m.group(1))
        if not 0 < pct <= 100:
            raise ValueError(f"a percentage must be in (0, 100], found {text!r}")
        return int(total_bytes * pct / 100)
    raise ValueError(f"expected a size such as 92G, 512M, 4096 or 80%, found {text!r}")


def format_size(n: int) -> str:
    """Short human form: 98784247808 -> '92.0G'."""
    for unit in ("P", "T", "G", "M", "K"):
        if abs(n) >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.1f}{unit}"
    return f"{n}B"
