"""A MoE layer's prompt on CUDA, moe_prefill's two ways side by side in one process: the grouped integer GEMMs ("int8",
three launches a layer) and the experts' 16-bit slabs (session 47: "slab" at kernels.EXPERT_SLAB_BYTES, "slab-MiB" at
that many MiB of expert weights a range; "@bn/warps" after either: dequantize's BLOCK_N and WARPS; session 48: "slab~tile"
dequantizes with the tile kernel where a layout has the word kernel), at model shapes and
several prompt lengths: median ms of CUDA-event-timed calls (a host sync inside where the table takes several ranges),
the speed-up over the first way, the rows an expert, and each way's relative error against float64 over the blocks'
values (the first --check tokens).

Random valid blocks in the layouts the engine keeps resident experts in (igemm_bench.LAYOUTS), one buffer per matrix
kind, each token routed to top-k random experts (uniform: a real router's imbalance gives some experts more rows).
    PYTHONPATH=.:bench python3 bench/moe_slab_bench.py --models qwen3,gpt-oss --tokens 256,512,2000,8000
    PYTHONPATH=.:bench python3 bench/moe_slab_bench.py --ways int8,slab,slab@32/4,slab@64/8,slab-256
"""

from __future__ import annotations

import argparse
import json

import torch
from igemm_bench import LAYOUTS
from kernels_bench import events_seconds, random_blocks

from sparkd.engine.kernels import dequantize as dequant, dispatch, moe_prefill as prefill_moe
from sparkd.engine.kernels.dequantize import dequantize
from sparkd.engine.kernels.moe import ExpertTable, prepare

# name: (model width D, expert width F, experts, top-k, gate/up layout, down layout, activation, biases): the layouts
# the engine keeps a Q4_K file's resident experts in (layers/quant_experts.py: gate and up pairx, the down pairx from
# width 2048, AUTO_DOWN_MIN_DIM; session 47 ran Qwen3's down as the file's blocks, calls 1-2 Q6T downs)
MODELS = {"qwen3": (2048, 768, 128, 8, "Q4T", "Q4T", "silu", False),
          "deepseek-v3": (7168, 2048, 256, 8, "Q4T", "Q4T", "silu", False),
          "gpt-oss": (2880, 2880, 32, 4, "MXFP4T", "MXFP4T", "swiglu_oai", True)}
DEVICE = "cuda"


def matrices(layout: str, n: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, object]:
    """n [rows, cols] matrices of random blocks packed in layout, one buffer: (buffer, byte offsets, layout qtype)."""
    qtype, ltype, pack = LAYOUTS[layout]
    fam = dispatch.FAMILIES[qtype]
    size = rows * cols // fam.block_values * fam.block_bytes
    raw = random_blocks(qtype, n * size, DEVICE)
    buf = raw if pack is None else torch.cat([pack(raw[e * size:(e + 1) * size], (rows, cols)) for e in range(n)])
    return buf, torch.arange(n, dtype=torch.int64) * (buf.numel() // n), ltype


def reference(table: ExpertTable, x: torch.Tensor, slots: torch.Tensor, w: torch.Tensor, act, bias) -> torch.Tensor:
    """The layer over x's rows in float64 from the blocks' values."""
    D, F = table.dim, table.width
    y = torch.zeros(x.shape[0], D, dtype=torch.float64, device=DEVICE)
    for e in slots.unique().tolist():
        parts = []
        for buf, offs, qtype, shape in ((table.gate, table.gate_offsets, table.gate_up_type, (F, D)),
                                        (table.up, table.up_offsets, table.gate_up_type, (F, D)),
                                        (table.down, table.down_offsets, table.down_type, (D, F))):
            span = shape[0] * dispatch.family(qtype).row_bytes(shape[1])
            parts.append(dequantize(buf[int(offs[e]):int(offs[e]) + span], qtype, shape).double())
        tok, k = (slots == e).nonzero(as_tuple=True)
        g, u = x[tok].double() @ parts[0].T, x[tok].double() @ parts[1].T
        if bias is not None:
            g, u = g + bias[e, :F].double(), u + bias[e, F:2 * F].double()
        h = prefill_moe._act_torch(g, u, act) @ parts[2].T
        if bias is not None:
            h = h + bias[e, 2 * F:].double()
        y.index_add_(0, tok, h * w[tok, k, None].double())
    return y


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3,gpt-oss", help=f"comma-separated: {', '.join(MODELS)}")
    ap.add_argument("--tokens", default="256,512,1000,2000,4000,8000")
    ap.add_argument("--ways", default="int8,slab,slab-256", help="int8, slab or slab-MiB, each optionally @bn/warps, ~tile; "
                                                                    "the first is the base")
    ap.add_argument("--check", type=int, default=16, help="tokens compared against float64 (0: none)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    out = []
    defaults = prefill_moe.EXPERT_SLAB_BYTES, dequant.BLOCK_N, dequant.WARPS
    for name in a.models.split(","):
        D, F, n, top_k, gu_layout, d_layout, act, biased = MODELS[name]
        gate, gate_off, gu_type = matrices(gu_layout, n, F, D)
        up, up_off, _ = matrices(gu_layout, n, F, D)
        down, down_off, d_type = matrices(d_layout, n, D, F)
        table = ExpertTable(gate, up, down, gate_off.tolist(), up_off.tolist(), down_off.tolist(), gu_type, d_type,
                            D, F)
        p = prepare(table, torch.device(DEVICE), "the bench")
        bias = torch.randn(n, 2 * F + D, device=DEVICE) if biased else None
        for tokens in (int(t) for t in a.tokens.split(",")):
            x = torch.randn(tokens, D, device=DEVICE)
            slots = torch.stack([torch.randperm(n, device=DEVICE)[:top_k] for _ in range(tokens)])
            w = torch.rand(tokens, top_k, device=DEVICE)
            ref = reference(table, x[:a.check], slots[:a.check], w[:a.check], act, bias) if a.check else None
            base = None
            for way in a.ways.split(","):
                spec, _, kernel = way.partition("~")
                kind, _, launch = spec.partition("@")
                slab = None if kind == "int8" else torch.bfloat16
                prefill_moe.EXPERT_SLAB_BYTES = int(kind.split("-")[1]) << 20 if "-" in kind else defaults[0]
                dequant.BLOCK_N, dequant.WARPS = (int(v) for v in launch.split("/")) if launch else defaults[1:]
                dequant.WORDS = kernel != "tile"
                run = lambda: prefill_moe.moe_prefill(p, x, slots, w, act, "int8", check_slots=False,  # noqa: E731
                                                      bias=bias, slab=slab)
                try:
                    y = run()
                    s = events_seconds(run, a.repeats)
                finally:
                    prefill_moe.EXPERT_SLAB_BYTES, dequant.BLOCK_N, dequant.WARPS = defaults
                    dequant.WORDS = True
                base = s if base is None else base
                r = {"model": name, "tokens": tokens, "rows_an_expert": tokens * top_k / n, "way": way,
                     "ms": s * 1e3, "speedup": base / s}
                if ref is not None:
                    r["err64"] = float((y[:a.check].double() - ref).norm() / ref.norm())
                out.append(r)
                print(f"{name:12s} x{tokens:<5d} ({r['rows_an_expert']:6.1f} rows an expert) {way:10s} "
                      f"{r['ms']:8.3f} ms {r['speedup']:5.2f}x err64 {r.get('err64', 0):.1e}", flush=True)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
