"""DeepSeek V4's KV compressor (llama.cpp build_{hca,overlap}_compressed_kv_from_state).

Every token contributes a value row (wkv) and a score row (wgate + a learned per-offset bias,
ape[pos % ratio]). When position pos completes a block (pos + 1 divisible by ratio), the block
starting at s = pos + 1 - ratio becomes one compressed entry: a per-dimension softmax over the
scores weights the values, then RMS norm and rope at position s on the last n_rot dims.
With overlap (ratio 4: CSA and the lightning indexer) rows are 2·dim wide and an entry reads the
first halves of the previous block's rows plus the second halves of its own rows (before position
0: zero values, -inf scores).

The rows a later block still needs (ratio, or 2·ratio with overlap) live in a ring in the
per-sequence cache state, so decoding token by token equals a full recompute. The positions
[0, p) have completed p // ratio entries: nothing else counts them.

A static step (a CUDA graph's, cache.span set, position on the device: session 33) writes its row
into the ring and, every step, the entry of its block from the ring's rows as they stand: the
eager step's entry where the position completes the block; before that an entry no query sees
yet (visible stops at the completed ones), rewritten when the block completes.
"""

from __future__ import annotations

import torch
from torch import nn

from sparkd.engine.kernels import fused
from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.linear import Linear
from sparkd.engine.layers.norm import RMSNorm
from sparkd.engine.layers.rope import apply_rope, rope_cos_sin
from sparkd.engine.layers.rope import RopeConfig


def pool(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """A block's entry before its norm: per column, the rows' values [B, n, d] weighted by the softmax over the rows
    of their scores → [B, d]. The softmax runs along a contiguous last dim: torch's over dim 1 of [1, 128, 512] (an
    HCA block) took 23 us a launch on the H200, a copy and a row softmax take a few."""
    weights = torch.softmax(score.transpose(1, 2).contiguous(), dim=-1).transpose(1, 2)
    return (kv * weights).sum(1)


def rope_tail(x: torch.Tensor, rope: RopeConfig, pos: torch.Tensor, inverse: bool = False,
              cache: KVCache | None = None) -> torch.Tensor:
    """Rope on the last n_rot dims of x [T, H, Dh] (ggml_rope_set_offset to Dh - n_rot). cache: its table of every
    position's angles on x's device (KVCache.rope: the same bits, without the host's sin/cos and two copies to the
    device, each a sync, per call), for positions that are a range."""
    cos, sin = rope_cos_sin(rope, pos) if cache is None else cache.rope(rope, pos)
    if cache is not None and not rope.neox and x.dtype == torch.float32 and fused.active("rope_tail", x):
        from sparkd.engine.kernels import rope_tail as kernel

        return kernel.rope_tail(x, cos, sin, inverse)  # one launch (the same bits)
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

    def reset(self) -> None:
        """A new sequence: the ring as __init__ makes it (entries are written before they are seen)."""
        self.kv.zero_()
        self.score.fill_(float("-inf"))


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

    def forward(self, x: torch.Tensor, pos: torch.Tensor, st: CompressorState,
                cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the entries x's positions complete → (the entries so far [C, dim], visible [T, C]: which of them
        each position sees, the blocks completed at it). pos [T] is on the host (the entries' rope runs there), or
        a static step's on the device (_step); x and st on the network's device."""
        if cache.span is not None:
            return self._step(x, pos, st, cache)
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
        for i in range(max(0, T - st.ring_rows), T):
            st.kv[(start + i) % st.ring_rows] = kv[i]
            st.score[(start + i) % st.ring_rows] = score[i]
        n = (start + T) // r
        complete = (torch.arange(start, start + T, device=x.device) + 1) // r  # (made there: no host copy)
        return st.entries[:n], torch.arange(n, device=x.device)[None, :] < complete[:, None]

    def _step(self, x: torch.Tensor, pos: torch.Tensor, st: CompressorState,
              cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """forward's one token at the device position pos [1]: its row into the ring, then its block's entry from
        the ring (_compress's sums over the same rows; positions before 0 zero values and -inf scores) written at
        pos // ratio; the entries of the span's positions [0, span // ratio + 1) and those visible."""
        r, ring = self.ratio, st.ring_rows
        kv, score = self.wkv(x), self.wgate(x)  # [1, width]
        first = pos - pos % r  # the block's start [1]
        if fused.active("compressor", x):  # the ring rows and the pooled entry in one launch
            from sparkd.engine.kernels.compressor import compress_step

            pooled = compress_step(kv, score, self.ape, st.kv, st.score, pos, r, self.overlap)
        else:
            st.kv.index_copy_(0, pos % ring, kv)
            st.score.index_copy_(0, pos % ring, score + self.ape[pos % r])
            cur = first[:, None] + torch.arange(r, device=x.device)  # [1, ratio] positions
            kv_b, sc_b = self._ring_rows(st, cur)
            if self.overlap:
                kv_p, sc_p = self._ring_rows(st, cur - r)
                d = self.dim
                kv_b = torch.cat([kv_p[..., :d], kv_b[..., d:]], dim=1)  # [1, 2r, d]
                sc_b = torch.cat([sc_p[..., :d], sc_b[..., d:]], dim=1)
            pooled = pool(kv_b, sc_b)
        comp = self.norm(pooled)
        st.entries.index_copy_(0, pos // r, rope_tail(comp[:, None, :], self.rope, first, cache=cache)[:, 0])
        C = cache.span // r + 1
        return st.entries[:C], torch.arange(C, device=x.device)[None, :] < ((pos + 1) // r)[:, None]

    @staticmethod
    def _ring_rows(st: CompressorState, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ring's value and score rows [B, n, width] of positions p [B, n] (device), zero and -inf before 0."""
        kv, score = st.kv[p % st.ring_rows], st.score[p % st.ring_rows]
        before = (p < 0)[..., None]
        return kv.masked_fill(before, 0.0), score.masked_fill(before, float("-inf"))

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
        comp = self.norm(pool(kv, sc))  # [B, d]
        return rope_tail(comp[:, None, :], self.rope, first)[:, 0]
