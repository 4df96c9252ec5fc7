"""Routing traces and census files.

A trace is text: a header line `# sparkd-trace v1 slot_bytes=N expert_bytes=N`, then one line per
expert-store request: `<step> <layer> <expert> <expert> ...` (step = forward pass). A census is
`<layer> <expert> <count>` lines: the experts a warm start loads first, hottest first.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sparkd.engine.errors import EngineError

HEADER = "# sparkd-trace v1"


@dataclass
class Trace:
    calls: list[tuple[int, int, list[int]]] = field(default_factory=list)  # step, layer, ids
    slot_bytes: int = 0
    expert_bytes: int = 0

    @property
    def steps(self) -> int:
        return len({c[0] for c in self.calls})


def trace_header(slot_bytes: int, expert_bytes: int) -> str:
    return f"{HEADER} slot_bytes={slot_bytes} expert_bytes={expert_bytes}\n"


def read_trace(path: str | Path) -> Trace:
    t = Trace()
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise EngineError(f"could not read trace {path}: {exc.strerror}") from exc
    for no, line in enumerate(lines, 1):
        if line.startswith(HEADER):
            fields = dict(kv.split("=", 1) for kv in line[len(HEADER):].split() if "=" in kv)
            t.slot_bytes = int(fields.get("slot_bytes", 0))
            t.expert_bytes = int(fields.get("expert_bytes", 0))
            continue
        if not line.strip() or line.startswith("#"):
            continue
        try:
            step, layer, *ids = (int(x) for x in line.split())
        except ValueError:
            raise EngineError(f"could not parse trace {path} line {no}: {line[:80]!r}; expected "
                              "'<step> <layer> <expert> ...' integers") from None
        t.calls.append((step, layer, ids))
    if not t.calls:
        raise EngineError(f"could not read trace {path}: it records no expert requests")
    return t


def census(trace: Trace) -> list[tuple[int, int, int]]:
    counts = Counter((layer, e) for _, layer, ids in trace.calls for e in ids)
    return [(layer, e, n) for (layer, e), n in counts.most_common()]


def write_census(path: str | Path, rows: list[tuple[int, int, int]]) -> None:
    Path(path).write_text("".join(f"{layer} {e} {n}\n" for layer, e, n in rows))


def read_census(path: str | Path) -> list[tuple[int, int]]:
    """(layer, expert) hottest first."""
    rows = []
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise EngineError(f"could not read census {path}: {exc.strerror}") from exc
    for no, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            try:
                layer, e, n = (int(x) for x in line.split())
            except ValueError:
                raise EngineError(f"could not parse census {path} line {no}: {line[:80]!r}; expected "
                                  "'<layer> <expert> <count>'") from None
            rows.append((n, layer, e))
    return [(layer, e) for n, layer, e in sorted(rows, key=lambda r: -r[0])]
