"""Session 45: is SPARKD_SDPA_PRECISION=half's 0.26 at 8000 tokens (call 1) its error or the model's sensitivity?
The 4-layer gpt-oss-20b F16 file's last 16 rows of logits under float32 and half, each against a float64 reference
(every F.scaled_dot_product_attention call in attention.py in float64, by query chunks), and float32 against float32
with the queries moved by one float32 ulp (the noise floor). Also the largest |scaled score| a layer sees, so a
half that fails on large scores shows. Usage: python sdpa_ref.py FILE [T ...]."""
import sys

import torch
from torch.nn import functional as F

from sparkd.engine.layers import attention
from sparkd.engine.models import load_model

SCORE = []  # the largest |scaled score| of each call


def sdpa64(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """F.scaled_dot_product_attention in float64, 256 queries at a time (no [H, T, S] float64 scores whole)."""
    T, S = q.shape[-2], k.shape[-2]
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=torch.float64, device=q.device)
    k64, v64 = k.double(), v.double()
    top = 0.0
    for a in range(0, T, 256):
        b = min(T, a + 256)
        s = (q[..., a:b, :].double() @ k64.transpose(-1, -2)) * scale
        i, j = torch.arange(a, b, device=q.device)[:, None], torch.arange(S, device=q.device)[None, :]
        if is_causal:
            keep = j <= i
        elif hasattr(attn_mask, "seq_len_kv"):  # causal_lower_right
            keep = j <= i + (attn_mask.seq_len_kv - attn_mask.seq_len_q)
        elif attn_mask is None:
            keep = torch.ones_like(j, dtype=torch.bool)
        else:
            keep = attn_mask[..., a:b, :]
        top = max(top, float(s.masked_fill(~keep, 0).abs().max()))
        out[..., a:b, :] = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v64
    SCORE.append(top)
    return out.to(q.dtype)


class Shim:
    scaled_dot_product_attention = staticmethod(sdpa64)

    def __getattr__(self, name):
        return getattr(F, name)


path, lengths = sys.argv[1], [int(t) for t in sys.argv[2:]] or [2000, 8000]
m = load_model(path, device="cuda", kernels=True)
for n in lengths:
    toks = torch.tensor([1 + i % 1000 for i in range(n)])

    def forward(mode, ref=False, nudge=False):
        attention.SDPA_PRECISION = mode
        attention.F = Shim() if ref else F
        cache = m.net.new_cache(n, kv_dtype=torch.float16)
        if nudge:  # every query one ulp up: the float32 noise floor
            was = attention.attend_sdpa

            def nudged(q, *a, **kw):
                return was(torch.nextafter(q, torch.full_like(q, float("inf"))), *a, **kw)
            attention.attend_sdpa = nudged
        try:
            with torch.no_grad():
                return m.net(toks, cache)[-16:].double().cpu()
        finally:
            attention.F = F
            if nudge:
                attention.attend_sdpa = was

    SCORE.clear()
    ref = forward("float32", ref=True)
    scores = list(SCORE)
    out = {"float32": forward("float32"), "half": forward("half"), "float32+ulp": forward("float32", nudge=True)}

    def rel(a, b):
        return float(((a - b).norm(dim=-1) / b.norm(dim=-1)).max())

    line = [f"{n} tokens: largest |score| a call {max(scores):.1f} (calls {len(scores)})"]
    for name, o in out.items():
        same = float((o.argmax(-1) == ref.argmax(-1)).double().mean())
        line.append(f"{name} vs float64 rel (worst of 16 rows) {rel(o, ref):.2e}, argmax same {same:.2f}")
    line.append(f"half vs float32 {rel(out['half'], out['float32']):.2e}")
    print("; ".join(line), flush=True)
m.close()
