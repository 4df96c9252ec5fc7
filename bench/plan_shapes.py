"""The memory plan's cache and prompt workspace for full-size model shapes, from sparse files (no weights written):
what a context costs before anything loads. Run it with PYTHONPATH at two trees to compare them (docs/performance.md,
session 37: the sliding-window rings, the workspace's widened keys). Shapes: the gpt-oss-20b preset, gpt-oss-120b
(its 36 layers and 128 experts on the 20b preset), a Gemma 3 27B-like shape (62 layers, 16 KV heads of 128, windows
of 1024 on 5 layers of 6), the qwen3-235b-a22b, glm-4.5-air and deepseek-v3 presets, DeepSeek V4 Flash (its own
cache; kv f16 is its f32 cache).

Usage: PYTHONPATH=. python3 bench/plan_shapes.py [--budget-gib 110] [--ctx 8192,32768,131072] [--json F]
(rope tables: the cos and sin of every position, session 38's plan term.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import PRESETS
from sparkd.engine.models import config_of
from sparkd.engine.streaming import plan as memory_plan
from sparkd.engine.streaming.plan import default_batch_tokens, kv_bytes, workspace_bytes

SHAPES = {
    "gpt-oss-20b": PRESETS["gpt-oss-20b"],
    "gpt-oss-120b": dataclasses.replace(PRESETS["gpt-oss-20b"], n_layer=36, n_expert=128),
    "gemma-3-27b-like": dataclasses.replace(PRESETS["gemma-3-270m"], n_layer=62, n_embd=5376, n_head=32,
                                            n_head_kv=16, head_dim=128, n_ctx=131072, n_ff=21504, n_swa=1024,
                                            swa_pattern=6),
    "qwen3-235b-a22b": PRESETS["qwen3-235b-a22b"],
    "glm-4.5-air": PRESETS["glm-4.5-air"],
    "deepseek-v3": PRESETS["deepseek-v3"],
    "deepseek-v4-flash": PRESETS["deepseek-v4-flash"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-gib", type=float, default=110.0, help="the memory budget the chunk size fits into")
    ap.add_argument("--ctx", default="8192,32768,131072", help="contexts, comma separated")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    budget, rows = int(args.budget_gib * (1 << 30)), []
    rope = getattr(memory_plan, "rope_bytes", None)  # (a tree before session 38 has no rope term)
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in SHAPES.items():
            path = write_model(Path(tmp) / f"{name}.gguf", plan(shape, "Q4_K"), sparse=True)[0]
            with GGUFModel.open(path) as g:
                cfg = config_of(g)
            for ctx in (int(c) for c in args.ctx.split(",")):
                chunk = default_batch_tokens(cfg, ctx, budget, cuda=True)
                row = dict(model=name, ctx=ctx, kv_f16_bytes=kv_bytes(cfg, ctx, "f16"), chunk=chunk,
                           workspace_bytes=workspace_bytes(cfg, ctx, chunk, cuda=True),
                           rope_bytes=rope(cfg, ctx) if rope else None)
                rows.append(row)
                print(f"{name:18s} ctx {ctx:>7d}  kv f16 {row['kv_f16_bytes'] / 1e9:7.2f} GB  chunk {chunk:>3d}  "
                      f"workspace {row['workspace_bytes'] / 1e9:6.2f} GB"
                      + (f"  rope tables {row['rope_bytes'] / 1e9:5.2f} GB" if rope else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
