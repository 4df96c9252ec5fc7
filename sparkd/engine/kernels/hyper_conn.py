"""DeepSeek V4's hyper-connection weights in one launch (layers/hyper_conn.py's torch code is the reference).

Per token, from the projection's mixes [(2 + hc) * hc]: pre = sigmoid(mixes[:hc] s0 + b) + eps, post =
2 sigmoid(mixes[hc:2hc] s1 + b), and comb = Sinkhorn(mixes[2hc:] s2 + b) [src, dst]: a softmax over dst, then
ITERS column and ITERS - 1 row normalisations alternating, all in one program's registers. In torch that is ~140
launches a call, two calls a layer: the most of a DeepSeek V4 decode step's launches (session 33).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _weights_kernel(mix_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, comb_ptr, eps, HC: tl.constexpr,
                    ITERS: tl.constexpr):
    t = tl.program_id(0)
    row = mix_ptr + t * ((2 + HC) * HC)
    i = tl.arange(0, HC)
    pre = tl.sigmoid(tl.load(row + i) * tl.load(scale_ptr) + tl.load(base_ptr + i)) + eps
    post = tl.sigmoid(tl.load(row + HC + i) * tl.load(scale_ptr + 1) + tl.load(base_ptr + HC + i)) * 2.0
    k = 2 * HC + i[:, None] * HC + i[None, :]  # [src, dst]
    c = tl.load(row + k) * tl.load(scale_ptr + 2) + tl.load(base_ptr + k)
    c = tl.exp(c - tl.max(c, 1)[:, None])
    c = c / tl.sum(c, 1)[:, None] + eps  # the softmax over dst, plus eps
    c = c / (tl.sum(c, 0)[None, :] + eps)  # columns (over src)
    for _ in tl.static_range(1, ITERS):
        c = c / (tl.sum(c, 1)[:, None] + eps)  # rows (over dst)
        c = c / (tl.sum(c, 0)[None, :] + eps)
    tl.store(pre_ptr + t * HC + i, pre)
    tl.store(post_ptr + t * HC + i, post)
    tl.store(comb_ptr + t * HC * HC + i[:, None] * HC + i[None, :], c)


def weights(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, hc: int, iters: int,
            eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre [T, hc], post [T, hc], comb [T, hc, hc]) of float32 mixes [T, (2 + hc) hc] (scale [3], base [(2 + hc) hc]):
    HyperConnection.pre's weights, one program a token."""
    T = mixes.shape[0]
    pre, post = (torch.empty(T, hc, dtype=torch.float32, device=mixes.device) for _ in range(2))
    comb = torch.empty(T, hc, hc, dtype=torch.float32, device=mixes.device)
    _weights_kernel[(T,)](mixes.float().contiguous(), scale.float().contiguous(), base.float().contiguous(), pre,
                          post, comb, eps, HC=hc, ITERS=iters, num_warps=1)
    return pre, post, comb
