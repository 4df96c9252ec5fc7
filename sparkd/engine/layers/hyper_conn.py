"""Manifold-constrained hyper-connections (DeepSeek V4, llama.cpp build_hc_pre/post/head).

The residual stream is hc parallel copies [T, hc, D]. Before a sublayer, a projection of the
RMS-normalised flattened stream gives per token: `pre` weights (sigmoid + eps) that mix the
copies into the sublayer input, `post` weights (2 * sigmoid) that spread the sublayer output back,
and an hc x hc `comb` matrix (Sinkhorn-normalised) that mixes the old copies.
"""

from __future__ import annotations

import torch
from torch import nn

from sparkd.engine.kernels import fused
from sparkd.engine.layers.norm import rms_normalize


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """comb [T, src, dst]: softmax over dst, then alternate column (over src) and row (over dst)
    normalisation, starting and ending with the columns, as the reference does."""
    comb = torch.softmax(comb, dim=-1) + eps

    def cols(c: torch.Tensor) -> torch.Tensor:
        return c / (c.sum(1, keepdim=True) + eps)
    comb = cols(comb)
    for _ in range(1, iters):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = cols(comb)
    return comb


def mix_copies(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """x [T, hc, D], pre [T, hc] → Σ_h x[:, h] * pre[:, h]  [T, D]."""
    out = x[:, 0] * pre[:, 0, None]
    for h in range(1, x.shape[1]):
        out = out + x[:, h] * pre[:, h, None]
    return out


class HyperConnection(nn.Module):
    """One sublayer's connection: pre() mixes the stream into the input, post() merges back."""

    def __init__(self, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, hc: int,
                 sinkhorn_iters: int, hc_eps: float, rms_eps: float):
        super().__init__()
        self.fn = nn.Parameter(fn, requires_grad=False)  # [(2 + hc) * hc, hc * D]
        self.base = nn.Parameter(base, requires_grad=False)  # [(2 + hc) * hc]
        self.scale = nn.Parameter(scale, requires_grad=False)  # [3]: pre, post, comb
        self.hc, self.iters, self.hc_eps, self.rms_eps = hc, sinkhorn_iters, hc_eps, rms_eps

    def pre(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, hc, D] → (sublayer input [T, D], post [T, hc], comb [T, src, dst])."""
        T, hc, _ = x.shape
        mixes = rms_normalize(x.reshape(T, -1), self.rms_eps) @ self.fn.T  # [T, (2 + hc) * hc]
        if fused.active("hyper_conn", x):  # the weights in one launch, the mix in one
            from sparkd.engine.kernels.hyper_conn import weights

            pre, post, comb = weights(mixes, self.scale, self.base, hc, self.iters, self.hc_eps)
            return torch.einsum("thd,th->td", x, pre), post, comb
        s, b = self.scale, self.base
        pre = torch.sigmoid(mixes[:, :hc] * s[0] + b[:hc]) + self.hc_eps
        post = torch.sigmoid(mixes[:, hc:2 * hc] * s[1] + b[hc:2 * hc]) * 2.0
        comb = (mixes[:, 2 * hc:] * s[2] + b[2 * hc:]).view(T, hc, hc)
        return mix_copies(x, pre), post, sinkhorn(comb, self.iters, self.hc_eps)

    @staticmethod
    def post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
             comb: torch.Tensor) -> torch.Tensor:
        """y [T, D] sublayer output → new stream [T, hc, D]: y * post[dst] + Σ_src res[src] * comb."""
        if fused.active("hyper_conn", y):  # two launches (the sums over src in another order)
            return torch.baddbmm(y[:, None, :] * post[..., None], comb.transpose(1, 2), residual)
        outs = []
        for dst in range(residual.shape[1]):
            cur = y * post[:, dst, None]
            for src in range(residual.shape[1]):
                cur = cur + residual[:, src] * comb[:, src, dst, None]
            outs.append(cur)
        return torch.stack(outs, dim=1)


class HyperHead(nn.Module):
    """The final collapse of the hc copies into one hidden state before the output norm."""

    def __init__(self, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
                 hc_eps: float, rms_eps: float):
        super().__init__()
        self.fn = nn.Parameter(fn, requires_grad=False)  # [hc, hc * D]
        self.base = nn.Parameter(base, requires_grad=False)  # [hc]
        self.scale = nn.Parameter(scale, requires_grad=False)  # [1]
        self.hc_eps, self.rms_eps = hc_eps, rms_eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixes = rms_normalize(x.reshape(x.shape[0], -1), self.rms_eps) @ self.fn.T  # [T, hc]
        pre = torch.sigmoid(mixes * self.scale[0] + self.base) + self.hc_eps
        return mix_copies(x, pre)
