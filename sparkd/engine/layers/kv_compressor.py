"""DeepSeek V4's KV compressor (llama.cpp build_{hca,overlap}_compressed_kv_from_state).

Every token contributes a value row (wkv) and a score row (wgate + a learned per-offset bias,
ape[pos % ratio]). When position pos completes a block (pos + 1 divisible by ratio), the block
starting at s = pos + 1 - ratio becomes one compressed entry: a per-dimension softmax over the
scores weights the values, then RMS norm and rope at position s on the last n_rot dims.
With overlap (ratio 4: CSA and the lightning indexer) rows are 2·dim wide and an entry reads the
first halves of the previous block's rows plus the second halves of its own rows (before position
0: zero values, -inf scores).

The rows a later block still needs (ratio, or 2·ratio with overlap) live in a ring in the
per-sequence cache state, so decoding token by token equals a full recompute.
"""

from __future__ import annotations

import torch
from torch import nn

from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.linear import Linear
from sparkd.engine.layers.norm import RMSNorm
from sparkd.engine.layers.rope import apply_rope, rope_cos_sin
from sparkd.engine.layers.rope import RopeConfig


def rope_tail(x: torch.Tensor, rope: RopeConfig, pos: torch.Tensor, inverse: bool = False,
              cache: KVCache | None = None) -> torch.Tensor:
    """Rope on the last n_rot dims of x [T, H, Dh] (ggml_rope_set_offset to Dh - n_rot). cache: its table of every
    position's angles on x's device (KVCache.rope: the same bits, without the host's sin/cos and two copies to the
    device, each a sync, per call), for positions that are a range."""
    cos, sin = rope_cos_sin(rope, pos) if cache is None else cache.rope(rope, pos)
    if inverse:
        sin = -sin
    n_nope = x.shape[-1] - rope.n_rot
    return torch.cat([x[..., :n_nope], apply_rope(x[..., n_nope:], cos, sin, rope.neox)], dim=-1)


class CompressorState:
    """One layer's compressor memory for one sequence: the ring of recent rows and the entries."""

    def __init__(self, ratio: int, width: int, dim: int, overlap: bool, max_ctx: int,
                 device: torch.device | str = "cpu"):
        self.ratio = ratio
        self.ring_rows = 2 * ratio if overlap else ratio
        self.kv = torch.zeros(self.ring_rows, width, device=device)
        self.score = torch.full((self.ring_rows, width), float("-inf"), device=device)
        self.entries = torch.zeros(max_ctx // ratio + 1, dim, device=device)
        self.n_entries = 0

    def reset(self) -> None:
        """A new sequence: the state __init__ makes (entries past n_entries are never read)."""
        self.kv.zero_()
        self.score.fill_(float("-inf"))
        self.n_entries = 0


class Compressor(nn.Module):
    def __init__(self, ratio: int, dim: int, overlap: bool, wkv: Linear, wgate: Linear,
                 ape: torch.Tensor, norm: RMSNorm, rope: RopeConfig):
        super().__init__()
        self.ratio, self.dim, self.overlap = ratio, dim, overlap
        self.wkv, self.wgate, self.norm, self.rope = wkv, wgate, norm, rope
        self.ape = nn.Parameter(ape, requires_grad=False)  # [ratio, width]

    @property
    def width(self) -> int:
        return self.wkv.out_features

    def new_state(self, max_ctx: int, device: torch.device | str = "cpu") -> CompressorState:
        return CompressorState(self.ratio, self.width, self.dim, self.overlap, max_ctx, device)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, st: CompressorState) -> torch.Tensor:
        """Append the entries x's positions complete; returns all entries so far [n, dim].
        pos [T] is on the host (rope runs there); x and st on the network's device."""
        start, T, r = int(pos[0]), x.shape[0], self.ratio
        kv = self.wkv(x)  # [T, width]
        score = self.wgate(x) + self.ape[torch.arange(start, start + T, device=x.device) % r]  # (no host copy)
        ends = [p for p in range(start, start + T) if (p + 1) % r == 0]
        if ends:
            src_kv = torch.cat([st.kv, kv, kv.new_zeros(1, self.width)])
            src_score = torch.cat([st.score, score, score.new_full((1, self.width), float("-inf"))])
            block_starts = torch.tensor(ends, device="cpu") + 1 - r
            comp = self._compress(src_kv, src_score, block_starts, start, st.ring_rows)
            b0 = ends[0] // r
            st.entries[b0:b0 + len(ends)] = comp
            st.n_entries = b0 + len(ends)
        for i in range(max(0, T - st.ring_rows), T):
            st.kv[(start + i) % st.ring_rows] = kv[i]
            st.score[(start + i) % st.ring_rows] = score[i]
        return st.entries[:st.n_entries]

    def _rows(self, first: torch.Tensor, start: int, ring: int, n_new: int) -> torch.Tensor:
        """Indices into [ring | new rows | zero row] of positions first + j, j < ratio (host)."""
        p = first[:, None] + torch.arange(self.ratio, device=first.device)[None, :]  # [B, ratio]
        idx = torch.where(p >= start, ring + (p - start), p % ring)
        return torch.where(p < 0, torch.full_like(p, ring + n_new), idx)

    def _compress(self, src_kv: torch.Tensor, src_score: torch.Tensor, first: torch.Tensor,
                  start: int, ring: int) -> torch.Tensor:
        n_new, d = src_kv.shape[0] - ring - 1, self.dim
        cur = self._rows(first, start, ring, n_new).to(src_kv.device)
        if self.overlap:
            prev = self._rows(first - self.ratio, start, ring, n_new).to(src_kv.device)
            kv = torch.cat([src_kv[prev][..., :d], src_kv[cur][..., d:]], dim=1)  # [B, 2r, d]
            sc = torch.cat([src_score[prev][..., :d], src_score[cur][..., d:]], dim=1)
        else:
            kv, sc = src_kv[cur], src_score[cur]  # [B, r, d]
        comp = (kv * torch.softmax(sc, dim=1)).sum(1)  # [B, d]
        comp = self.norm(comp)
        return rope_tail(comp[:, None, :], self.rope, first)[:, 0]
