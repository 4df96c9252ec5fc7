"""The pressure scenario's record: the service cgroup's memory files sampled twice a second, the
thresholds they crossed (stall per second from PSI totals, the way sparkd's rules compute it), and
one timeline merging those with sparkd's own events (`sparkctl events --json`)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

SAMPLE_SECONDS = 0.5
# The default policy's PSI thresholds (policies/dgx-spark.yaml), in stalled seconds per second.
THRESHOLDS = (("some", 0.15, "warn-some-pressure"), ("full", 0.10, "shrink-on-full-pressure"),
              ("full", 0.50, "stop-on-sustained-full-pressure"))
EVENT_COUNTERS = ("high", "max", "oom", "oom_kill")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def psi_totals_us(text: str) -> dict[str, int]:
    """{'some': total_us, 'full': total_us} from a memory.pressure file's text."""
    totals = {}
    for line in text.splitlines():
        kind, *fields = line.split()
        totals[kind] = int(dict(f.split("=") for f in fields)["total"])
    return totals


def counters(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in text.splitlines())}


class Sampler:
    """Samples cgroup's memory.current, memory.pressure and memory.events into rows."""

    def __init__(self, cgroup: Path, t0: float):
        self.cgroup, self.t0 = cgroup, t0
        self.rows: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            pressure = _read(self.cgroup / "memory.pressure")
            current = _read(self.cgroup / "memory.current").strip()
            self.rows.append({"t": time.time() - self.t0, "current": int(current) if current else None,
                              "psi": psi_totals_us(pressure) if pressure else {},
                              "events": counters(_read(self.cgroup / "memory.events"))})
            self._stop.wait(SAMPLE_SECONDS)

    def with_rates(self) -> list[dict]:
        """Each row plus the stall per second over the second before it (from PSI totals)."""
        out = []
        for i, row in enumerate(self.rows):
            back = next((r for r in reversed(self.rows[:i]) if row["t"] - r["t"] >= 0.95), None)
            rate = {}
            if back is not None and row["psi"] and back["psi"]:
                rate = {k: (row["psi"][k] - back["psi"][k]) / 1e6 / (row["t"] - back["t"]) for k in row["psi"]}
            out.append({**row, "stall_per_second": rate})
        return out

    def write_tsv(self, path: Path) -> None:
        with open(path, "w") as f:
            f.write("t_seconds\tmemory.current_mib\tsome_s_per_s\tfull_s_per_s\t" + "\t".join(EVENT_COUNTERS) + "\n")
            for r in self.with_rates():
                cur = f"{r['current'] / (1 << 20):.0f}" if r["current"] is not None else "-"
                rate = [f"{r['stall_per_second'].get(k, float('nan')):.3f}" for k in ("some", "full")]
                ev = [str(r["events"].get(k, "-")) for k in EVENT_COUNTERS]
                f.write("\t".join([f"{r['t']:.2f}", cur, *rate, *ev]) + "\n")


def kernel_marks(rows: list[dict]) -> list[tuple[float, str]]:
    """When the cgroup's files first crossed each threshold, and when memory.events counters
    first rose."""
    marks = []
    for kind, threshold, rule in THRESHOLDS:
        hit = next((r for r in rows if r["stall_per_second"].get(kind, 0) >= threshold), None)
        if hit is not None:
            marks.append((hit["t"], f"kernel: {kind} stall {hit['stall_per_second'][kind]:.3f} s/s "
                                    f">= {threshold} ({rule}'s threshold)"))
    first = rows[0]["events"] if rows else {}
    for name in EVENT_COUNTERS:
        hit = next((r for r in rows if r["events"].get(name, 0) > first.get(name, 0)), None)
        if hit is not None:
            marks.append((hit["t"], f"kernel: memory.events {name} {first.get(name, 0)} -> {hit['events'][name]}"))
    return marks


def longest_run(rows: list[dict], kind: str, threshold: float) -> float:
    """The longest stretch (seconds) in which the sampled stall per second stayed >= threshold."""
    best, start = 0.0, None
    for r in rows:
        if r["stall_per_second"].get(kind, 0) >= threshold:
            start = r["t"] if start is None else start
            best = max(best, r["t"] - start)
        else:
            start = None
    return best


_SKIPPED = ("detector_running",)
_VALUES = ("stall_seconds", "threshold_seconds", "trigger_fired", "avg10", "counter", "before", "after")


def event_marks(events: list[dict], t0: float) -> list[tuple[float, str]]:
    marks = []
    for e in events:
        if e["type"] in _SKIPPED:
            continue
        action = e.get("action")
        action = ",".join(action) if isinstance(action, list) else action
        what = " ".join(str(x) for x in (e["type"], e.get("service"), e.get("detector"), e.get("rule"), action) if x)
        vals = {k: (e.get("values") or {})[k] for k in _VALUES if k in (e.get("values") or {})}
        marks.append((e["time"] - t0, f"sparkd: {what} {json.dumps(vals) if vals else ''} {e.get('result') or ''}".rstrip()))
    return marks


def print_timeline(marks: list[tuple[float, str]], title: str) -> None:
    print(f"\n== {title} ==")
    for t, text in sorted(marks, key=lambda m: m[0]):
        print(f"{t:+8.2f}s  {text}")


def first_time(events: list[dict], t0: float, etype: str, rule: str, action: str | None = None) -> float | None:
    for e in events:
        if e["type"] == etype and e.get("rule") == rule and (action is None or e.get("action") == action):
            return e["time"] - t0
    return None
