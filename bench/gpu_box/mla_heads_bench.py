"""MLA's absorbed one-token products (layers/mla.py _absorbed) at real shapes: q_nope [H, Dn] through each head's k
matrix [R, Dn] (attn_k_b) and the attention's latent output [H, R] through each head's v matrix [Dv, R] (attn_v_b).
Before session 35 both were f32 einsums (the weights dequantized at load); now one grouped GEMV each
(KernelLinear.grouped) over the file's blocks. Also KernelLinear.dense, what a prompt pays to dequantize them.

Weights rotate over >= ROTATE_BYTES (past the 50 MB L2); each time is a CUDA graph of a pass, median of 15.
Usage (GPU box): PYTHONPATH=. python3 bench/gpu_box/mla_heads_bench.py [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels_bench import ROTATE_BYTES, copy_bandwidth, events_seconds, graph_seconds, random_blocks  # noqa: E402

from sparkd.engine.kernels import dispatch  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, gemv  # noqa: E402
from sparkd.engine.layers.act_round import vec_dot_format  # noqa: E402
from sparkd.engine.layers.linear import KernelLinear  # noqa: E402

# (name, heads, kv rank, nope dims, value dims)
SHAPES = [("deepseek-v3", 128, 512, 128, 128), ("kimi-k2", 64, 512, 128, 128)]
# (k type, v type): a Q4_K_M file's (llama-quantize's fallback for 128-wide rows: Q5_0), a Q8_0 file's
TYPES = [(T.Q5_0, T.Q4_K), (T.Q8_0, T.Q8_0)]


def copies(qtype: T, rows: int, cols: int) -> list[KernelLinear]:
    nbytes = dispatch.FAMILIES[qtype].row_bytes(cols) * rows
    n = max(2, -(-ROTATE_BYTES // nbytes))
    buf = random_blocks(qtype, n * nbytes)
    return [KernelLinear(buf[i * nbytes:(i + 1) * nbytes], qtype, (rows, cols), act_fmt=vec_dot_format(qtype))
            for i in range(n)]


def product(name: str, H: int, rows: int, cols: int, qtype: T, copy_bw: float) -> dict:
    """One head-grouped product: rows per head, cols wide; the kernel against the f32 einsum on its values."""
    ks = copies(qtype, H * rows, cols)
    x = torch.randn(1, H, cols, device="cuda")
    W = ks[0].dense().view(H, rows, cols)
    want = torch.einsum("thi,hoi->tho", x.double(), W.double())
    got = ks[0].grouped(x)
    err = float((got.double() - want).norm() / want.norm())
    kernel = graph_seconds(lambda i: ks[i % len(ks)].grouped(x), len(ks))
    n_f32 = max(2, -(-ROTATE_BYTES // (W.numel() * 4)))
    f32 = [torch.randn(H, rows, cols, device="cuda") for _ in range(n_f32)]
    before = graph_seconds(lambda i: torch.einsum("thi,hoi->tho", x, f32[i % n_f32]), n_f32)
    dense = events_seconds(ks[0].dense)
    qbytes = ks[0].raw.numel()
    return dict(shape=name, product=f"{H}x{rows}x{cols}", type=qtype.name, rel_err=err,
                kernel_us=kernel * 1e6, f32_us=before * 1e6, speedup=before / kernel,
                kernel_frac=qbytes / kernel / copy_bw, f32_frac=W.numel() * 4 / before / copy_bw,
                weight_mb=qbytes / 1e6, f32_mb=W.numel() * 4 / 1e6, dense_us=dense * 1e6)


# tiles tried on each product with --sweep (rows per program, warps, groups a step)
SWEEP = [GemvConfig(block_n=b, num_warps=w, unroll=u, split=1) for b in (2, 4, 8, 16, 32) for w in (1, 2, 4)
         for u in (1, 2) if b >= w]


def sweep(H: int, rows: int, cols: int, qtype: T) -> list[tuple[str, float]]:
    """Microseconds of the grouped GEMV per tile (each checked against the default tile's output: nan where it
    differs by more than float32 rounding)."""
    ks = copies(qtype, H * rows, cols)
    x = torch.randn(H, cols, device="cuda")
    want = ks[0].grouped(x[None])[0].reshape(-1)
    out = []
    for cfg in SWEEP:
        y = gemv(ks[0].raw, qtype, ks[0].shape, x, config=cfg, round_x=ks[0]._round)
        # (a norm, not allclose's elementwise bound: another tile's summation order misses that near zero; session
        # 35's call 2 marked such tiles nan)
        if not float((y - want).norm() / want.norm()) < 1e-5:
            out.append((f"{cfg.block_n}/{cfg.num_warps}/{cfg.unroll}", float("nan")))
            continue
        sec = graph_seconds(lambda i: gemv(ks[i % len(ks)].raw, qtype, ks[0].shape, x, config=cfg,
                                           round_x=ks[0]._round), len(ks))
        out.append((f"{cfg.block_n}/{cfg.num_warps}/{cfg.unroll}", sec * 1e6))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--sweep", action="store_true", help="also time SWEEP's tiles on DeepSeek V3's products")
    a = ap.parse_args()
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s (read + written)")
    rows = []
    for name, H, R, Dn, Dv in SHAPES:
        for tk, tv in TYPES:
            for r in (product(name, H, R, Dn, tk, copy_bw), product(name, H, Dv, R, tv, copy_bw)):
                rows.append(r)
                print(f"{r['shape']:12s} {r['product']:14s} {r['type']:5s} kernel {r['kernel_us']:7.1f} us "
                      f"({r['kernel_frac']:.2f} of copy, {r['weight_mb']:.1f} MB)  f32 {r['f32_us']:7.1f} us "
                      f"({r['f32_frac']:.2f}, {r['f32_mb']:.1f} MB)  x{r['speedup']:.2f}  "
                      f"dense {r['dense_us']:.1f} us  err {r['rel_err']:.1e}", flush=True)
    tiles = {}
    if a.sweep:
        _, H, R, Dn, Dv = SHAPES[0]
        for tk, tv in TYPES:
            for key, args in ((f"k {tk.name}", (H, R, Dn, tk)), (f"v {tv.name}", (H, Dv, R, tv))):
                tiles[key] = sweep(*args)
                best = sorted((t for t in tiles[key] if t[1] == t[1]), key=lambda t: t[1])[:4]
                print(f"sweep {key}: best " + ", ".join(f"{n} {us:.1f} us" for n, us in best), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(dict(copy_bw=copy_bw, rows=rows, tiles=tiles), indent=1))


if __name__ == "__main__":
    main()
