"""MLA's prompt attention (DeepSeek V3: 128 query heads, a 512-wide latent row and 64 rope dims a position) alone,
from the query's nope and rope parts and the cached latent and rope rows to the heads' 128 output values, by way:

- "torch": layers/mla.py's prompt as it stands: the queries absorbed into latent space through wk_b, attend's
  einsums over the 576-wide rows ([H, T, S] float32 scores in memory), wv_b after;
- "sdpa": the same absorbed rows through attend_sdpa (torch's memory-efficient kernel; the latent row repeated
  for every head);
- "mha": the latent rows expanded to per-head keys (128 nope + 64 rope) and values (128) through wk_b and wv_b, then
  attend_sdpa: the attention at 192/128 wide instead of 576/512, for the expansion's S x 512 x H x 256 GEMMs (the
  engine's under SPARKD_SDPA_PRECISION=float32, or over float32 rows);
- "mha-half" (session 45; the engine's default since session 46): the expansion over float16 rows as they are, float16
  keys and values, attend_sdpa's half path (SPARKD_SDPA_PRECISION=half, the default).

GPU time (CUDA events around --iters calls, median of --repeats) and, where --check-max allows the float64
reference, each way's relative error against "torch" in float64. Prompts from position 0 (--tokens) and prompts
continuing a cache (--new T --cached C).

    python3 bench/gpu_box/mla_prefill_bench.py --tokens 512,2048,8000 --new 512 --cached 7488 --json out.json
"""

from __future__ import annotations

import argparse
import json

import torch
from prefill_attention_bench import gpu_ms

from sparkd.engine.layers.attention import attend, attend_sdpa
from sparkd.engine.layers.mla import expand_rows

H, NOPE, ROPE, LATENT, VALUE = 128, 128, 64, 512, 128


def absorbed(attn, q_nope, q_pe, rows, wk_b, wv_b, scale, start):
    q = torch.cat([torch.einsum("thd,hrd->thr", q_nope, wk_b), q_pe], dim=-1)  # [T, H, 576]
    o = attn(q, rows[:, None], rows[:, None, :LATENT], scale, start)  # [T, H, 512]
    return torch.einsum("thr,hvr->thv", o, wv_b)


def mha(q_nope, q_pe, rows, wk_b, wv_b, scale, start, half=False):
    """mla.MLAttention._expanded's heads all at once: the rows widened to float32, or under half (the engine's default,
    SPARKD_SDPA_PRECISION=half) the expansion in the rows' type."""
    rows = rows if half else rows.to(q_nope.dtype)
    k, v = expand_rows(rows, wk_b.to(rows.dtype), wv_b.to(rows.dtype))
    return attend_sdpa(torch.cat([q_nope, q_pe], dim=-1), k, v, scale, start)


WAYS = {"torch": lambda *a: absorbed(attend, *a), "sdpa": lambda *a: absorbed(attend_sdpa, *a), "mha": mha,
        "mha-half": lambda *a: mha(*a, half=True)}


def case(T: int, C: int, kv: torch.dtype, a) -> dict:
    g = torch.Generator(device="cuda").manual_seed(T + C)
    S = C + T
    r = lambda *shape, s=1.0: torch.randn(*shape, device="cuda", generator=g) * s  # noqa: E731
    args = (r(T, H, NOPE), r(T, H, ROPE), r(S, LATENT + ROPE).to(kv),
            r(H, LATENT, NOPE, s=LATENT ** -0.5), r(H, VALUE, LATENT, s=LATENT ** -0.5), (NOPE + ROPE) ** -0.5, C)
    res = {"tokens": T, "cached": C, "kv": str(kv).split(".")[-1]}
    ref = None
    if S <= a.check_max:
        ref = absorbed(attend, *[x.double() if isinstance(x, torch.Tensor) else x for x in args])
    for name in a.ways.split(","):
        try:
            out = WAYS[name](*args)
            res[f"{name}_ms"] = gpu_ms(lambda: WAYS[name](*args), a.iters, a.repeats)
            if ref is not None:
                res[f"{name}_err"] = float((out.double() - ref).norm() / ref.norm())
            del out
        except torch.OutOfMemoryError as e:
            res[f"{name}_ms"] = f"out of memory: {str(e).splitlines()[0][:80]}"
        torch.cuda.empty_cache()
    print(json.dumps(res), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,2048", help="prompts from position 0")
    ap.add_argument("--new", default="", help="prompts of these lengths continuing --cached positions")
    ap.add_argument("--cached", default="")
    ap.add_argument("--ways", default="torch,sdpa,mha,mha-half")
    ap.add_argument("--kv", default="f16", choices=("f16", "f32"), help="the cached rows' type")
    ap.add_argument("--check-max", type=int, default=2560, help="the float64 reference up to this many keys")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    kv = torch.float16 if a.kv == "f16" else torch.float32
    shapes = [(int(t), 0) for t in a.tokens.split(",") if t]
    shapes += [(int(t), int(c)) for t in a.new.split(",") if t for c in a.cached.split(",") if c]
    rows = [case(T, C, kv, a) for T, C in shapes]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
