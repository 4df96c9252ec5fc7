"""Cross-layer residual attention (Kimi K3's AttnRes).

Every `block_size` layers the raw residual stream entering the layer is banked as a checkpoint
and the stream restarts from that layer's attention output. Before each attention and FFN (and
before the output norm) the input is a softmax-weighted mix of the banked checkpoints and the
current stream: checkpoint j scores sum(rmsnorm(h_j) * w) with a learned vector w per site, the
mix sums the raw (un-normalised) values. Mixing is per token position, so nothing crosses tokens
and nothing needs caching between forward calls.
"""

from __future__ import annotations

import torch
from torch import nn

from sparkd.engine.layers.norm import RMSNorm


class ResidualMix(nn.Module):
    """One mixing site: softmax over [checkpoints..., current] of rmsnorm(h)·score_w."""

    def __init__(self, score_w: torch.Tensor, eps: float):
        super().__init__()
        self.score = RMSNorm(score_w, eps)  # rmsnorm(h) * w; summed over the width below

    def forward(self, stack: list[torch.Tensor], cur: torch.Tensor) -> torch.Tensor:
        # stack: checkpoints [T, D] each; cur [T, D]
        if not stack:
            return cur  # nothing banked yet (layer 0's attention)
        hs = torch.stack([*stack, cur])  # [C+1, T, D]
        probs = torch.softmax(self.score(hs).sum(-1), dim=0)  # [C+1, T]
        return (hs * probs[..., None]).sum(0)
