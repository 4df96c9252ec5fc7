"""How often the fused RMSNorm's float32 output changes with the compiler's FMA contraction on
(session 4's launch) against off (session 5's, which act_quant's rounding needs), on random rows
of Qwen3-30B-A3B's width at mixed magnitudes, and each one's error against the torch reference
(layers/norm.py, float64 mean of squares). On the GPU box:
    python3 bench/gpu_box/rms_norm_fusion_diff.py --rows 16384
"""

from __future__ import annotations

import argparse

import torch

from sparkd.engine.kernels.rms_norm import _rms_norm_rows
from sparkd.engine.layers.norm import rms_normalize


def norm(x: torch.Tensor, w: torch.Tensor, fusion: bool) -> torch.Tensor:
    out = torch.empty_like(x)
    R, D = x.shape
    _rms_norm_rows[(R,)](x, w, out, out, out, out, out, out, D, D, D, 1e-6, HAS_RES=False, BLOCK=D,
                         QBLOCK=0, K8=False, num_warps=8, enable_fp_fusion=fusion)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--width", type=int, default=2048)
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.rows, a.width, generator=g) * 10.0 ** torch.empty(a.rows, 1).uniform_(-3, 2, generator=g)
    w = torch.randn(a.width, generator=g)
    want = rms_normalize(x.double(), 1e-6) * w.double()
    on, off = (norm(x.cuda(), w.cuda(), f).cpu() for f in (True, False))
    differ = on != off
    print(f"{a.rows} rows x {a.width}: {int(differ.any(1).sum())} rows, {int(differ.sum())} values differ "
          f"between FMA contraction on and off")
    for name, got in (("on", on), ("off", off)):
        err = ((got.double() - want).norm(dim=1) / want.norm(dim=1)).max()
        exact = (got == want.float()).float().mean()
        print(f"fusion {name}: max row rel err vs torch float64 {float(err):.3e}, "
              f"share equal to the float64 reference rounded to float32 {float(exact):.6f}")


if __name__ == "__main__":
    main()
