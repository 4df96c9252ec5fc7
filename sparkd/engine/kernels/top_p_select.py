"""The top-p cut without a sort (DeviceSampler's path "topp": top_k 0 with top_p < 1): the key
(sample_draw._key: logit descending, id ascending, the host's stable order) of the last token the
host Sampler keeps, i.e. the last in that order whose mass before it (the softmax of the penalised
logits) is short of top_p; sample_draw.full_draw then draws among the tokens at or above it.

A select over the logits' order-preserving 32 bits (_ordered) in stages of two launches each:
_select_hist, a program per block of the full draw's logits buffer, adds each token's exp(x - max)
into BINS bins that split the current key range evenly (atomics on fixed-point integers: the sums
do not depend on the atomics' order, so a seed repeats its tokens), and _select_choose, one
program, takes the bin where the mass from the top reaches top_p times the total; its key range is
the next stage's. When that bin holds at most GATHER tokens (or one key: ties) the next
_select_hist copies its tokens' (key, id) out instead, and the next _select_choose sorts them and
finds the cut among them exactly (or, for ties past GATHER, the k-th lowest id of the tied value
by the blocks' counts). log2(BINS) key bits a stage, so at most ceil(32 / log2(BINS)) stages plus
the gathering one; a stage whose work is done returns at once (the launches are fixed: one graph).

Why not session 17's radix select (c7708ec, 870 us on the H200): its rounds had one program per
1024-token block walking 32 dependent steps of a [32, 256] one-hot float64 sum; here a token is one
load and two atomics, and a stage's bin is usually down to a few tokens after two stages.
Why two launches a stage and the full draw's own sums and pick after (session 20, topp45, H200): a
stage folded into one launch (its last program to finish choosing) with the draw in the gathering
stage's last program, 5 launches instead of 11, was 0.4-3.1 us faster a draw (0.5-2.4 %): the
graph's launches are not the cost, the bin scan is (BINS above).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine import switches
from sparkd.engine.kernels.family import KernelArgumentError
from sparkd.engine.kernels.sample_draw import SENTINEL, DrawScratch, _key, _unkey, full_draw

# Bins a stage (10 key bits: four searching stages and the gathering one; $SPARKD_TOP_P_BINS 2048, session 20's 11
# bits, 4096 session 19's 12) and the tokens the last stage sorts (one program's sort; a few tokens on real logits).
# Fewer bins: _select_choose's one-program scan is most of a stage (H200, session 20: 4096 -> 2048 bins took a flat
# row's draw from 86.4 to 73.6 us over its two choosing stages; session 23, draw_graph_bench --top-p-only: 2048 ->
# 1024 flat 73.5 -> 68.8-69.2 us, peaked 61.3 -> 58.5, thousands of ties at the cut 104.1 -> 106.2-106.8 (one more
# stage); 512 lost on every row: 75.4-82.0, 70.6, 115.3)
BINS_ENV = "SPARKD_TOP_P_BINS"
BINS = int(switches.choice(BINS_ENV, ("512", "1024", "2048", "4096"), "1024"))  # read once
GATHER = 1024
SMALL_SORT = 64  # the sort most draws take (their bin's few tokens)
# fixed point: a token's mass (<= 1) as hi (2**-40 units) and lo (the next 24 bits) int64s; lo's
# word also counts the token (bit 44 up): the sums of MAX_TOKENS tokens stay below 2**63
HI_UNITS, LO_UNITS = tl.constexpr(2.0 ** 40), tl.constexpr(2.0 ** 24)   # per 1, per hi unit
COUNT_SHIFT, COUNT_ONE = tl.constexpr(44), tl.constexpr(1 << 44)
MAX_TOKENS = 2 ** 19
# the state words (an int64 vector; tl.constexpr: a kernel reads no other globals): the stage whose
# choose found the last bin (-1: none yet), that bin's key range, the mass above it and the total
# (fixed point), its count, the tokens gathered from it
DONE, LO, HI, ABOVE_HI, ABOVE_LO, TOTAL_HI, TOTAL_LO, COUNT, GATHERED = (tl.constexpr(i) for i in range(9))


@triton.jit
def _ordered(x):
    """x's float32 bits as an int64 in [0, 2**32) that orders as x does (-inf lowest); the high
    half of _key(x, id) is this minus 2**31."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64) + 2 ** 31


@triton.jit
def _fixed(hi, lo):
    return (hi.to(tl.float64) + lo.to(tl.float64) / LO_UNITS) / HI_UNITS


@triton.jit
def _top(max_ptr, n_blocks, N_BLOCKS: tl.constexpr):
    b = tl.arange(0, N_BLOCKS)
    return tl.max(tl.load(max_ptr + b, mask=b < n_blocks, other=float("-inf")), axis=0).to(tl.float64)


@triton.jit
def _select_hist(x_ptr, max_ptr, n_blocks, n_vocab, state_ptr, hist_ptr, gathered_ptr, in_range_ptr,
                 STAGE: tl.constexpr, BLOCK: tl.constexpr, N_BLOCKS: tl.constexpr, BINS: tl.constexpr,
                 GATHER: tl.constexpr):
    pid = tl.program_id(0)
    ids = pid * BLOCK + tl.arange(0, BLOCK)
    live = ids < n_vocab
    x = tl.load(x_ptr + ids, mask=live, other=float("-inf"))
    u = _ordered(x)
    if STAGE == 0:  # the whole key range
        inside = live & (x > float("-inf"))
        b = (u * BINS) >> 32
        _add(x, inside, b, max_ptr, n_blocks, hist_ptr, N_BLOCKS, BINS)
    else:
        done = tl.load(state_ptr + DONE)
        lo, hi = tl.load(state_ptr + LO), tl.load(state_ptr + HI)
        inside = live & (x > float("-inf")) & (u >= lo) & (u <= hi)
        if done < 0:
            b = ((u - lo) * BINS) // (hi - lo + 1)
            _add(x, inside, b, max_ptr, n_blocks, hist_ptr + STAGE * 2 * BINS, N_BLOCKS, BINS)
        elif done == STAGE - 1:  # the bin found: its tokens' count by block, and their keys if few
            here = tl.sum(inside.to(tl.int32), axis=0)
            tl.store(in_range_ptr + pid, here)
            if tl.load(state_ptr + COUNT) <= GATHER:
                at = tl.atomic_add(state_ptr + GATHERED, here.to(tl.int64), sem="relaxed")
                slot = at + tl.cumsum(inside.to(tl.int32), axis=0) - 1
                tl.store(gathered_ptr + slot, _key(x, ids), mask=inside)


@triton.jit
def _add(x, inside, b, max_ptr, n_blocks, hist_ptr, N_BLOCKS: tl.constexpr, BINS: tl.constexpr):
    """Each token's exp(x - max) in fixed point, and a count, into its bin b."""
    y = tl.exp(x.to(tl.float64) - _top(max_ptr, n_blocks, N_BLOCKS)) * HI_UNITS
    hi = y.to(tl.int64)
    lo = ((y - hi.to(tl.float64)) * LO_UNITS).to(tl.int64)
    tl.atomic_add(hist_ptr + b, hi, mask=inside, sem="relaxed")
    tl.atomic_add(hist_ptr + BINS + b, lo + COUNT_ONE, mask=inside, sem="relaxed")


@triton.jit
def _select_choose(x_ptr, max_ptr, n_blocks, n_vocab, top_p_ptr, state_ptr, hist_ptr, gathered_ptr, in_range_ptr,
                   cut_ptr, STAGE: tl.constexpr, LAST: tl.constexpr, BLOCK: tl.constexpr,
                   N_BLOCKS: tl.constexpr, BINS: tl.constexpr, GATHER: tl.constexpr, SMALL_SORT: tl.constexpr):
    if STAGE == 0:
        _choose_bin(top_p_ptr, state_ptr, hist_ptr, 0, 2 ** 32 - 1, 0, 0, STAGE, LAST, BINS, GATHER)
    else:
        done = tl.load(state_ptr + DONE)
        if done < 0:
            _choose_bin(top_p_ptr, state_ptr, hist_ptr + STAGE * 2 * BINS, tl.load(state_ptr + LO),
                        tl.load(state_ptr + HI), tl.load(state_ptr + ABOVE_HI), tl.load(state_ptr + ABOVE_LO),
                        STAGE, LAST, BINS, GATHER)
        elif done == STAGE - 1:
            _cut(x_ptr, max_ptr, n_blocks, n_vocab, top_p_ptr, state_ptr, gathered_ptr, in_range_ptr, cut_ptr,
                 BLOCK, N_BLOCKS, GATHER, SMALL_SORT)


@triton.jit
def _choose_bin(top_p_ptr, state_ptr, hist_ptr, lo, hi, above_hi, above_lo, STAGE: tl.constexpr,
                LAST: tl.constexpr, BINS: tl.constexpr, GATHER: tl.constexpr):
    """The first bin from the top where the mass above the range plus the bins' reaches top_p of
    the total (stage 0: the sum of its bins); its key range, count and the mass above it to the
    state; the histogram zeroed for the next draw."""
    r = tl.arange(0, BINS)  # r 0: the highest bin
    hi_sums = tl.load(hist_ptr + BINS - 1 - r)
    packed = tl.load(hist_ptr + 2 * BINS - 1 - r)
    counts = packed >> COUNT_SHIFT
    lo_sums = packed - (counts << COUNT_SHIFT)
    if STAGE == 0:
        total_hi, total_lo = tl.sum(hi_sums, axis=0), tl.sum(lo_sums, axis=0)
        tl.store(state_ptr + TOTAL_HI, total_hi)
        tl.store(state_ptr + TOTAL_LO, total_lo)
    else:
        total_hi, total_lo = tl.load(state_ptr + TOTAL_HI), tl.load(state_ptr + TOTAL_LO)
    target = tl.load(top_p_ptr) * _fixed(total_hi, total_lo)
    cum_hi, cum_lo = above_hi + tl.cumsum(hi_sums, axis=0), above_lo + tl.cumsum(lo_sums, axis=0)
    # rounding short of the target everywhere: the lowest bin with tokens
    pick = tl.minimum(tl.sum((_fixed(cum_hi, cum_lo) < target).to(tl.int32), axis=0),
                      tl.max(tl.where(counts > 0, r, 0), axis=0))
    chosen = r == pick
    width = hi - lo + 1
    b = (BINS - 1 - pick).to(tl.int64)
    new_lo = lo + (b * width + BINS - 1) // BINS  # the keys whose (u - lo) * BINS // width is b
    new_hi = lo + ((b + 1) * width + BINS - 1) // BINS - 1
    count = tl.sum(tl.where(chosen, counts, 0), axis=0)
    tl.store(state_ptr + LO, new_lo)
    tl.store(state_ptr + HI, new_hi)
    tl.store(state_ptr + ABOVE_HI, tl.sum(tl.where(chosen, cum_hi - hi_sums, 0), axis=0))
    tl.store(state_ptr + ABOVE_LO, tl.sum(tl.where(chosen, cum_lo - lo_sums, 0), axis=0))
    tl.store(state_ptr + COUNT, count)
    tl.store(state_ptr + GATHERED, count * 0)
    done = (count <= GATHER) | (new_lo == new_hi) | LAST
    tl.store(state_ptr + DONE, tl.where(done, STAGE, -1).to(tl.int64))
    tl.store(hist_ptr + r, hi_sums * 0)
    tl.store(hist_ptr + BINS + r, packed * 0)


@triton.jit
def _cut_sorted(gathered_ptr, count, above, target, top, N: tl.constexpr):
    """The last of the gathered tokens, in key order, whose mass before it is short of the target."""
    g = tl.arange(0, N)
    there = g < count
    keys = tl.sort(tl.load(gathered_ptr + g, mask=there, other=SENTINEL), descending=True)
    x, _ = _unkey(keys)
    mass = tl.where(there, tl.exp(x.to(tl.float64) - top), 0.0)
    before = above + tl.cumsum(mass, axis=0) - mass
    k = tl.maximum(tl.sum((there & (before < target)).to(tl.int64), axis=0), 1)
    return tl.sum(tl.where(g == k - 1, keys, 0), axis=0)


@triton.jit
def _cut(x_ptr, max_ptr, n_blocks, n_vocab, top_p_ptr, state_ptr, gathered_ptr, in_range_ptr, cut_ptr,
         BLOCK: tl.constexpr, N_BLOCKS: tl.constexpr, GATHER: tl.constexpr, SMALL_SORT: tl.constexpr):
    """The cut inside the chosen bin: the host's before < top_p on its tokens in key order."""
    count, lo = tl.load(state_ptr + COUNT), tl.load(state_ptr + LO)
    above = _fixed(tl.load(state_ptr + ABOVE_HI), tl.load(state_ptr + ABOVE_LO))
    target = tl.load(top_p_ptr) * _fixed(tl.load(state_ptr + TOTAL_HI), tl.load(state_ptr + TOTAL_LO))
    top = _top(max_ptr, n_blocks, N_BLOCKS)
    if count <= SMALL_SORT:  # (most draws: a sort of 64 keys, not GATHER's)
        cut = _cut_sorted(gathered_ptr, count, above, target, top, SMALL_SORT)
    elif count <= GATHER:
        cut = _cut_sorted(gathered_ptr, count, above, target, top, GATHER)
    else:  # more ties of one value than the gather holds: the first k by id stay
        ordered = (lo - 2 ** 31).to(tl.int32)
        v = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
        q = tl.exp(v.to(tl.float64) - top)
        # k = #i in [0, count) with above + i q < target: ceil((target - above) / q), then corrected
        # for the division's rounding; ties of mass 0 all stay (the bin was chosen: the mass is short)
        y = tl.minimum(tl.maximum((target - above) / tl.where(q > 0, q, 1.0), 0.0), count.to(tl.float64))
        k = y.to(tl.int64)
        k += ((k < count) & (above + k.to(tl.float64) * q < target)).to(tl.int64)
        k += ((k < count) & (above + k.to(tl.float64) * q < target)).to(tl.int64)
        k -= ((k > 1) & (above + (k - 1).to(tl.float64) * q >= target)).to(tl.int64)
        k = tl.where(q > 0, tl.minimum(tl.maximum(k, 1), count), count)
        # the block holding the k-th tie (by the blocks' counts), then the tie in it
        b = tl.arange(0, N_BLOCKS)
        per_block = tl.load(in_range_ptr + b, mask=b < n_blocks, other=0).to(tl.int64)
        upto = tl.cumsum(per_block, axis=0)
        block = tl.sum((upto < k).to(tl.int32), axis=0)
        rest = k - tl.sum(tl.where(b == block, upto - per_block, 0), axis=0)
        ids = block * BLOCK + tl.arange(0, BLOCK)
        tied = (ids < n_vocab) & (_ordered(tl.load(x_ptr + ids, mask=ids < n_vocab, other=float("-inf"))) == lo)
        last = tl.sum(tl.where(tied & (tl.cumsum(tied.to(tl.int64), axis=0) == rest), ids, 0), axis=0)
        cut = _key(v, last)
    tl.store(cut_ptr, cut)


class SelectScratch:
    """The select's fixed buffers (a CUDA graph captures their addresses) for a DrawScratch."""

    def __init__(self, draw: DrawScratch, device: torch.device, bins: int = BINS, gather: int = GATHER):
        if not (bins >= 2 and not bins & (bins - 1) and gather >= 1 and not gather & (gather - 1)):
            raise KernelArgumentError(f"could not size the top-p select: bins={bins} and gather={gather} must be "
                                      "powers of two, bins >= 2")
        if draw.n_vocab >= MAX_TOKENS:
            raise KernelArgumentError(f"could not size the top-p select for {draw.n_vocab} tokens: its fixed-point "
                                      f"sums hold fewer than {MAX_TOKENS}")
        self.bins, self.gather = bins, gather
        self.stages = -(-32 // (bins.bit_length() - 1)) + 1  # the searching stages and the gathering one
        self.hist = torch.zeros(self.stages, 2, bins, dtype=torch.long, device=device)  # zeroed after each use
        self.state = torch.zeros(9, dtype=torch.long, device=device)
        self.gathered = torch.zeros(gather, dtype=torch.long, device=device)
        self.in_range = torch.zeros(draw.n_blocks, dtype=torch.int32, device=device)
        self.cut = torch.zeros(1, dtype=torch.long, device=device)

    def __call__(self, s, draw: DrawScratch) -> torch.Tensor:
        """Launch the select over draw.logits (after _full_logits) with s.top_p; returns the cut."""
        n, n_pow2 = draw.n_blocks, triton.next_power_of_2(draw.n_blocks)
        for stage in range(self.stages):
            _select_hist[(n,)](draw.logits, draw.block_max, n, draw.n_vocab, self.state, self.hist, self.gathered,
                               self.in_range, STAGE=stage, BLOCK=draw.block_tokens, N_BLOCKS=n_pow2, BINS=self.bins,
                               GATHER=self.gather, num_warps=4)
            _select_choose[(1,)](draw.logits, draw.block_max, n, draw.n_vocab, s.top_p, self.state, self.hist,
                                 self.gathered, self.in_range, self.cut, STAGE=stage, LAST=stage == self.stages - 2,
                                 BLOCK=draw.block_tokens, N_BLOCKS=n_pow2, BINS=self.bins, GATHER=self.gather,
                                 SMALL_SORT=min(SMALL_SORT, self.gather),
                                 num_warps=16)  # the bin scan's int64s: 4 (4096 bins: 8) of each a thread
        return self.cut

    def outcome(self) -> tuple[int, int]:
        """(the stage whose choose found the last bin, the tokens gathered from it: 0 where its ties took the
        count path) of the last select run; a host sync, for tests and benches."""
        state = self.state.tolist()
        return state[DONE.value], state[GATHERED.value]


def top_p_draw(s, scratch: DrawScratch, logits: torch.Tensor, fed: torch.Tensor | None, advance: bool,
               store: bool = False) -> torch.Tensor:
    """full_draw over the top-p prefix (top_k 0, s.top_p < 1); s.select: its SelectScratch."""
    return full_draw(s, scratch, logits, fed, advance, store, select=s.select)
