"""System-wide memory from /proc/meminfo, in bytes.

The guards compare a service's budget against MemAvailable (the kernel's estimate of what can be
allocated without swapping), not MemFree: page cache counts as available.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import SparkdError

DEFAULT_MEMINFO_PATH = Path("/proc/meminfo")
# /proc/meminfo field -> MemInfo attribute; all four exist on every kernel sparkd supports (>= 3.14).
_FIELDS = {
    "MemTotal": "total_bytes",
    "MemAvailable": "available_bytes",
    "SwapTotal": "swap_total_bytes",
    "SwapFree": "swap_free_bytes",
}
_UNIT_BYTES = {"kB": 1024, "": 1}  # the kernel writes "kB" meaning KiB


@dataclass(frozen=True)
class MemInfo:
    total_bytes: int
    available_bytes: int
    swap_total_bytes: int
    swap_free_bytes: int

    @property
    def swap_used_bytes(self) -> int:
        return self.swap_total_bytes - self.swap_free_bytes

    def to_dict(self) -> dict:
        return asdict(self)


def parse_meminfo(text: str, *, source: str = str(DEFAULT_MEMINFO_PATH)) -> MemInfo:
    """MemInfo from the text of /proc/meminfo; source names the file in errors."""
    found: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        key, sep, rest = line.partition(":")
        if not sep or key not in _FIELDS:
            continue
        parts = rest.split()
        unit = parts[1] if len(parts) > 1 else ""
        if not parts or not parts[0].isdigit() or unit not in _UNIT_BYTES:
            raise SparkdError(f"could not parse {source} line {lineno}: expected '{key}: <number> kB', found {line!r}")
        found[_FIELDS[key]] = int(parts[0]) * _UNIT_BYTES[unit]
    missing = [k for k, attr in _FIELDS.items() if attr not in found]
    if missing:
        raise SparkdError(f"could not parse {source}: missing {', '.join(missing)} (is this a Linux /proc/meminfo?)")
    return MemInfo(**found)


def read_meminfo(path: Path = DEFAULT_MEMINFO_PATH) -> MemInfo:
    """Read and parse a meminfo file (the path is a parameter so tests can hand in literal files)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SparkdError(f"could not read {path}: {exc.strerror}") from exc
    return parse_meminfo(text, source=str(path))
