"""One run of vram_memory.sh against its plan: the host total and staging term the engine printed
(stderr of `sparkd-engine generate`), the cgroup's memory.peak and oom kills, and the anon/file
memory.stat samples (the load's own transient: bench/load_memory.py, which vram_memory.sh runs too).

    python3 bench/gpu_box/memory_summary.py --label auto --err gen.err --stat stat.txt \
        --peak "$(cat $CG/memory.peak)" --events "$CG/memory.events"
"""

from __future__ import annotations

import argparse
import json
import re

_ROW = re.compile(r"^\s+(total|staging|budget|runtime|cuda runtime|expert cache)\s+([\d,]+) bytes")


def host_plan(err_text: str) -> dict[str, int]:
    """The host section's rows of the printed memory plan (it ends where the device one starts)."""
    rows: dict[str, int] = {}
    for line in err_text.split("device (")[0].splitlines():
        m = _ROW.match(line)
        if m:
            rows[m[1].replace(" ", "_")] = int(m[2].replace(",", ""))
    return rows


def samples(stat_text: str, key: str) -> list[int]:
    return [int(v) for v in re.findall(rf"\b{key}=(\d+)", stat_text)]


def summarize(label: str, err_text: str, stat_text: str, peak_bytes: int, events_text: str) -> dict:
    plan = host_plan(err_text)
    anon, file = samples(stat_text, "anon"), samples(stat_text, "file")
    both = [a + f for a, f in zip(anon, file)]
    oom = re.search(r"oom_kill (\d+)", events_text)
    total = plan.get("total", 0)
    return {"label": label, "plan_host_total_bytes": total, "plan_staging_bytes": plan.get("staging", 0),
            "memory_peak_bytes": peak_bytes, "max_anon_bytes": max(anon, default=0),
            "max_anon_plus_file_bytes": max(both, default=0),
            "max_anon_over_plan": round(max(anon, default=0) / total, 3) if total else None,
            "peak_over_plan": round(peak_bytes / total, 3) if total else None,
            "oom_kills": int(oom[1]) if oom else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--err", required=True)
    ap.add_argument("--stat", required=True)
    ap.add_argument("--peak", type=int, required=True)
    ap.add_argument("--events", required=True)
    a = ap.parse_args()
    with open(a.err) as e, open(a.stat) as s, open(a.events) as v:
        print(json.dumps(summarize(a.label, e.read(), s.read(), a.peak, v.read())))


if __name__ == "__main__":
    main()
