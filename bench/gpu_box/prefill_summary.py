"""The prefill side by side as a markdown table: prefill_bench.py's JSON per model against
llama-bench's (`-p N,... -n 0 -o json`) on the same GGUF.
    python3 bench/gpu_box/prefill_summary.py Q8_0=prefill_Q8_0.json,llama_Q8_0.json Q4_K=...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def llama_pp(path: str) -> dict[int, float]:
    """{prompt tokens: avg tok/s} of a llama-bench JSON, whatever the CUDA backend printed before it."""
    try:
        text = Path(path).read_text()
        rows = json.JSONDecoder().raw_decode(text[text.index("["):])[0]
    except (OSError, ValueError):
        return {}
    return {r["n_prompt"]: r["avg_ts"] for r in rows if r.get("n_gen", 0) == 0}


def table(models: dict[str, tuple[str, str]]) -> str:
    lines = []
    for name, (ours_path, llama_path) in models.items():
        try:
            ours = json.loads(Path(ours_path).read_text())
        except (OSError, ValueError):
            lines.append(f"{name}: no prefill_bench result ({ours_path})")
            continue
        ref = llama_pp(llama_path)
        variants = list(ours["runs"])
        lines += [f"\n{name} ({ours['model']}, {ours['gpu']}): prompt tok/s, ratio to llama.cpp in ()",
                  "| prompt | " + " | ".join(f"sparkd {v}" for v in variants) + " | llama.cpp |",
                  "|---" * (len(variants) + 2) + "|"]
        lengths = sorted({int(n) for runs in ours["runs"].values() for n in runs})
        for n in lengths:
            cells = []
            for v in variants:
                r = ours["runs"][v].get(str(n))
                ratio = f" ({r['tok_s'] / ref[n]:.2f})" if r and n in ref else ""
                cells.append(f"{r['tok_s']:.0f}{ratio}" if r else "-")
            lines.append(f"| {n} | " + " | ".join(cells) + (f" | {ref[n]:.0f} |" if n in ref else " | - |"))
        lines.append("agreement with the first way (last token's logits): " + ", ".join(
            f"{v} {a['max_diff_over_max']:.1e}{'' if a['argmax_equal'] else ' ARGMAX DIFFERS'}"
            for v, a in ours["agreement"].items()))
    return "\n".join(lines)


def main() -> int:
    models = {}
    for arg in sys.argv[1:]:
        name, _, paths = arg.partition("=")
        ours, _, llama = paths.partition(",")
        models[name] = (ours, llama)
    print(table(models))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
