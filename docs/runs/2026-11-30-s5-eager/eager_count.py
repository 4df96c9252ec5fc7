"""Kernels one eager one-token decode step launches (CPU dispatch count, the fused kernels under
TRITON_INTERPRET=1; bench/gpu_box/launch_count.py's count_cpu), with the decode kernels serving
the eager step (SPARKD_FUSED_EAGER on, this branch) and without (off, before it).
Usage: TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 docs/runs/2026-11-30-s5-eager/eager_count.py"""

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location("launch_count", "bench/gpu_box/launch_count.py")
lc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lc)

from sparkd.engine.kernels import fused  # noqa: E402
from sparkd.engine.models import load_model  # noqa: E402


def eager_counts(net, eager: bool) -> dict:
    before, before_eager = fused.configure("all", on_cpu=True), fused.configure_eager(eager)
    try:
        cache = net.new_cache(64)
        net(torch.tensor([1, 7, 42]), cache)
        net(torch.tensor([5]), cache)  # outside the count
        return lc.count_cpu(lambda: net(torch.tensor([6]), cache))
    finally:
        fused.configure(before)
        fused.configure_eager(before_eager)


with tempfile.TemporaryDirectory() as tmp:
    m = load_model(lc.tiny_model("qwen3moe", Path(tmp)), device="cpu")
    try:
        res = {"off": eager_counts(m.net, False), "on": eager_counts(m.net, True), "n_layer": len(m.net.blocks)}
    finally:
        m.close()
attn_ops = ("index_copy_", "copy_", "repeat_interleave", "_softmax", "masked_fill", "cat", "mul", "sub", "add",
            "bmm", "arange", "gt", "triton:_rope_kv", "triton:_decode_attention", "fill_")
for k in ("off", "on"):
    print(f"eager {k}: {res[k]['total']} launches/step ({res['n_layer']} layers); "
          + ", ".join(f"{op} {res[k]['ops'].get(op, 0)}" for op in attn_ops))
json.dump(res, sys.stdout if len(sys.argv) < 2 else open(sys.argv[1], "w"), indent=1)
