"""A temperature draw over one logits row in Triton launches (device_sampler.DeviceSampler's fused
path, for requests with 1 <= top_k <= CAP, device_sampler.CAP; and its full path, below).

_candidates, a program per BLOCK tokens: logit + bias, the repetition penalty (a token counts as
seen while its count in the window is > 0; the token being fed is counted in on the fly), then
the block's max and sum of exp(x - max) in float64 (the full softmax's denominator, combined
later), and the block's CAP best tokens by (logit descending, id ascending), the host's stable
argsort order, packed in one int64 key and sorted.
(_merge, optional: the best CAP of each group of blocks' lists, so that smaller blocks do not
widen _choose's sort.)
_choose, one program: the best CAP of all blocks' candidates, the host chain on them (top-k,
top-p on the full-vocabulary probabilities, min-p, temperature), one float64 uniform from Philox
(seed and draw counter in device buffers), the token; then it commits the fed token to the ring.
The candidates' final probabilities and ids stay in buffers (probabilities() reads them).

The full draw (full_draw; requests with top_k 0, or >= the vocabulary, and top_p 1: every token
can be drawn, so no candidates and no sort) inverts the CDF over block sums in three launches:
_full_logits, a program per block: the penalised logits (_penalised, as _candidates) to a
buffer and the block's max; _full_sums, a program per block: min-p against the global max, the
block's sum of exp(x / T - max / T) in float64; _full_pick, one program: the Philox uniform picks
the block by the cumulative block sums, then the token inside it by the cumulative exps of its
tokens (recomputed as _full_sums did). Inverse CDF rather than Gumbel-max: one uniform a draw
(as _choose), float64 throughout, and the sums are the softmax's denominator anyway.

The top-p draw (top_p_draw; top_k 0 with top_p < 1) tries the candidates first (session 18): the
fused draw over the CAP best tokens, top_k 0 meaning no top-k cut. Where their mass (over the whole
vocabulary) reaches top_p, or min-p drops the last of them, the tokens the host keeps are all among
them and that draw is exact; _choose then sets a flag (scratch.hit) and the launches after it return
at once (the token stands). Else (a flat distribution), the full draw restricted to the
host's kept prefix: the ranked tokens whose mass before them (softmax of the penalised logits)
is short of top_p. That prefix ends at a threshold logit v (the largest value whose tokens at or
above it hold >= top_p of the mass), found without a sort by a radix select over the logits'
order-preserving 32 bits: four rounds of 8 bits, each a program per block adding its tokens'
exp(x - max) into 256 bins by the next 8 bits (those matching the bits found so far; fixed
order, float64) and one program adding the blocks' bins and taking the bin where the mass from
the top reaches top_p. Tokens tied at v are ranked by id (the host's stable sort): the first k
of them stay, k the count whose mass before them is still short, handed to each block as how
many of its own ties stay. _full_sums and _full_pick then weigh only the kept tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels.family import KernelArgumentError

# the top-p select: 8 key bits a round (four rounds), tokens a step of a block's histogram
TOP_P_BINS = 256
TOP_P_CHUNK = 32
SENTINEL = tl.constexpr(-(2 ** 63))  # below every real key; its id part decodes to 2**31 - 1 (not a token)


@triton.jit
def _key(x, ids):
    """(x descending, id ascending) as an int64 that sorts the same way, descending: the float's
    bits made order-preserving as int32 in the high half, 2**31 - 1 - id in the low half."""
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - ids).to(tl.int64)


@triton.jit
def _ordered(x):
    """x's float32 bits as an int64 in [0, 2**32) that orders as x does (-inf lowest)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64) + 2 ** 31


@triton.jit
def _unkey(key):
    ordered = (key >> 32).to(tl.int32)
    x = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    return x, 0x7FFFFFFF - (key & 0x7FFFFFFF)


@triton.jit
def _penalised(logits_ptr, bias_ptr, counts_ptr, ring_ptr, slot_ptr, token_ptr, penalty_ptr, ids, live, push):
    """The logits of ids + bias, the repetition penalty applied; -inf past the vocabulary."""
    x = tl.load(logits_ptr + ids, mask=live, other=0.0).to(tl.float32)
    x = x + tl.load(bias_ptr + ids, mask=live, other=0.0)
    seen = tl.load(counts_ptr + ids, mask=live, other=0)
    if push != 0:  # the fed token joins the window, the slot's old token leaves it
        old = tl.load(ring_ptr + tl.load(slot_ptr))
        fed = tl.load(token_ptr)
        seen += (ids == fed).to(tl.int32) - (ids == old).to(tl.int32)
    penalty = tl.load(penalty_ptr)
    x = tl.where(seen > 0, tl.where(x > 0, tl.math.div_rn(x, penalty), x * penalty), x)
    return tl.where(live, x + 0.0, float("-inf"))  # + 0.0: -0.0 ties with 0.0, as in torch's sort


@triton.jit(do_not_specialize=["push"])
def _candidates(logits_ptr, bias_ptr, counts_ptr, ring_ptr, slot_ptr, token_ptr, penalty_ptr,
                keys_ptr, max_ptr, sum_ptr, n_vocab, push, BLOCK: tl.constexpr, CAP: tl.constexpr):
    pid = tl.program_id(0)
    ids = pid * BLOCK + tl.arange(0, BLOCK)
    live = ids < n_vocab
    x = _penalised(logits_ptr, bias_ptr, counts_ptr, ring_ptr, slot_ptr, token_ptr, penalty_ptr, ids, live, push)
    top = tl.max(x, axis=0)
    e = tl.where(x > float("-inf"), tl.exp(x.to(tl.float64) - top.to(tl.float64)), 0.0)
    tl.store(max_ptr + pid, top)
    tl.store(sum_ptr + pid, tl.sum(e, axis=0))
    keys = tl.sort(tl.where(live, _key(x, ids), SENTINEL), descending=True)
    r = tl.arange(0, BLOCK)
    tl.store(keys_ptr + pid * CAP + r, keys, mask=r < CAP)


@triton.jit
def _uniform(seed_ptr, draws):
    """A float64 uniform in [0, 1) from 53 Philox bits at (seed, draw count)."""
    a, b, _, _ = tl.randint4x(tl.load(seed_ptr), draws.to(tl.int32))
    hi = (a >> 5).to(tl.int64)
    lo = (b >> 6).to(tl.int64)
    return (hi * 67108864 + lo).to(tl.float64) / 9007199254740992.0


@triton.jit
def _filter(ids, r, probs, n_vocab, top_k_ptr, top_p_ptr, min_p_ptr):
    """The host's filter_logits keep mask on the ranked candidates (top_k 0: no top-k, the top-p draw)."""
    top_p, top_k = tl.load(top_p_ptr), tl.load(top_k_ptr)
    keep = (r < top_k) | (top_k == 0)
    before = tl.cumsum(probs, axis=0) - probs
    keep &= before < tl.where(top_p >= 1.0, float("inf"), top_p)  # the host skips top_p 1
    keep &= probs >= tl.load(min_p_ptr) * tl.max(tl.where(r == 0, probs, 0.0), axis=0)
    return (keep & (ids < n_vocab)) | (r == 0)


@triton.jit
def _holds_nucleus(ids, r, probs, n_vocab, top_p_ptr, min_p_ptr, CAP: tl.constexpr):
    """Whether the CAP best tokens hold every token top-p and min-p keep (top_k 0): the first token
    past them is dropped when the candidates' mass reaches top_p (its mass before it is theirs), or
    when min-p drops the last candidate (it is no likelier); or there is none (the whole vocabulary)."""
    mass = tl.sum(probs, axis=0)
    last = tl.sum(tl.where(r == CAP - 1, probs, 0.0), axis=0)
    first = tl.sum(tl.where(r == 0, probs, 0.0), axis=0)
    every = tl.sum((ids < n_vocab).to(tl.int32), axis=0) >= n_vocab
    return (mass >= tl.load(top_p_ptr)) | (last < tl.load(min_p_ptr) * first) | every


@triton.jit
def _commit(ring_ptr, slot_ptr, slot, old, fed, window_ptr, counts_ptr, n_vocab):
    """The fed token replaces the slot's oldest one (old) in the ring and the window counts."""
    moved = old != fed
    gone = moved & (old < n_vocab)
    tl.store(ring_ptr + slot, fed)
    tl.store(counts_ptr + old, tl.load(counts_ptr + old, mask=gone, other=0) - 1, mask=gone)
    tl.store(counts_ptr + fed, tl.load(counts_ptr + fed, mask=moved, other=0) + 1, mask=moved)
    tl.store(slot_ptr, (slot + 1) % tl.load(window_ptr))


@triton.jit
def _merge(keys_ptr, n_keys, out_ptr, GROUP_KEYS: tl.constexpr, CAP: tl.constexpr):
    """The best CAP of each GROUP_KEYS candidates (a group of blocks' lists): an optional middle
    launch that trades _choose's one wide sort for several narrow ones."""
    pid = tl.program_id(0)
    c = pid * GROUP_KEYS + tl.arange(0, GROUP_KEYS)
    keys = tl.sort(tl.load(keys_ptr + c, mask=c < n_keys, other=SENTINEL), descending=True)
    r = tl.arange(0, GROUP_KEYS)
    tl.store(out_ptr + pid * CAP + r, keys, mask=r < CAP)


@triton.jit(do_not_specialize=["push", "advance"])
def _choose(keys_ptr, n_keys, max_ptr, sum_ptr, n_blocks, n_vocab, temperature_ptr, top_k_ptr, top_p_ptr,
            min_p_ptr, seed_ptr, draws_ptr, ring_ptr, slot_ptr, window_ptr, counts_ptr, token_ptr,
            out_ptr, ids_out_ptr, probs_out_ptr, hit_ptr, push, advance,
            N_KEYS: tl.constexpr, N_BLOCKS: tl.constexpr, CAP: tl.constexpr, NUCLEUS: tl.constexpr):
    # every state read before any write (the program's warps do not run in step)
    draws = tl.load(draws_ptr)
    slot = tl.load(slot_ptr)
    old = tl.load(ring_ptr + slot)
    fed = tl.load(token_ptr)
    c = tl.arange(0, N_KEYS)
    keys = tl.sort(tl.load(keys_ptr + c, mask=c < n_keys, other=SENTINEL), descending=True)
    rows = tl.reshape(keys, (N_KEYS // CAP, CAP))
    first = tl.arange(0, N_KEYS // CAP)[:, None] == 0
    v, ids = _unkey(tl.max(tl.where(first, rows, SENTINEL), axis=0))  # the best CAP, in order
    b = tl.arange(0, N_BLOCKS)
    bmax = tl.load(max_ptr + b, mask=b < n_blocks, other=float("-inf")).to(tl.float64)
    bsum = tl.load(sum_ptr + b, mask=b < n_blocks, other=0.0)
    top = tl.max(bmax, axis=0)
    total = tl.sum(tl.where(bmax > float("-inf"), bsum * tl.exp(bmax - top), 0.0), axis=0)
    r = tl.arange(0, CAP)
    probs = tl.where(ids < n_vocab, tl.exp(v.to(tl.float64) - top) / total, 0.0)
    keep = _filter(ids, r, probs, n_vocab, top_k_ptr, top_p_ptr, min_p_ptr)
    x = v.to(tl.float64) / tl.load(temperature_ptr)
    w = tl.where(keep, tl.exp(x - tl.max(tl.where(keep, x, float("-inf")), axis=0)), 0.0)
    p = w / tl.sum(w, axis=0)
    tl.store(ids_out_ptr + r, ids)
    tl.store(probs_out_ptr + r, p)
    # the first rank whose cumulative probability exceeds u times the total; never one of p 0
    cdf = tl.cumsum(p, axis=0)
    rank = tl.sum((cdf <= _uniform(seed_ptr, draws) * tl.max(cdf, axis=0)).to(tl.int32), axis=0)
    rank = tl.minimum(rank, tl.sum((p > 0).to(tl.int32), axis=0) - 1)
    tl.store(out_ptr, tl.sum(tl.where(r == rank, ids, 0), axis=0))
    if NUCLEUS:  # the top-p draw: whether the candidates hold every token the host's filters keep
        hit = _holds_nucleus(ids, r, probs, n_vocab, top_p_ptr, min_p_ptr, CAP)
        tl.store(hit_ptr, hit.to(tl.int64))
        tl.store(hit_ptr + 1, tl.load(hit_ptr + 1) + hit.to(tl.int64))  # hits and draws, for the benches
        tl.store(hit_ptr + 2, tl.load(hit_ptr + 2) + 1)
    if advance != 0:
        tl.store(draws_ptr, draws + 1)
    if push != 0:
        _commit(ring_ptr, slot_ptr, slot, old, fed, window_ptr, counts_ptr, n_vocab)


@triton.jit(do_not_specialize=["push"])
def _full_logits(logits_ptr, bias_ptr, counts_ptr, ring_ptr, slot_ptr, token_ptr, penalty_ptr,
                 x_ptr, max_ptr, n_vocab, push, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    ids = pid * BLOCK + tl.arange(0, BLOCK)
    live = ids < n_vocab
    x = _penalised(logits_ptr, bias_ptr, counts_ptr, ring_ptr, slot_ptr, token_ptr, penalty_ptr, ids, live, push)
    tl.store(x_ptr + ids, x, mask=live)
    tl.store(max_ptr + pid, tl.max(x, axis=0))


@triton.jit
def _full_weights(x_ptr, ids, live, top, temperature_ptr, min_p_ptr, cut_ptr, ties_ptr, block,
                  TOP_P: tl.constexpr):
    """The host chain's unnormalised final probabilities of ids (block `block`'s tokens, in order):
    min-p on the softmax of the penalised logits (exp(x - max) >= min_p, the best token's being 1),
    TOP_P: only the kept prefix (above the cut, or tied at it and among the block's first kept
    ties), then exp(x / T - max / T)."""
    x32 = tl.load(x_ptr + ids, mask=live, other=float("-inf"))
    x = x32.to(tl.float64)
    temperature = tl.load(temperature_ptr)
    keep = (x > float("-inf")) & (tl.exp(x - top) >= tl.load(min_p_ptr))
    if TOP_P:
        u, cut = _ordered(x32), tl.load(cut_ptr)
        tied = live & (u == cut)
        keep &= (u > cut) | (tied & (tl.cumsum(tied.to(tl.int32), axis=0) <= tl.load(ties_ptr + block)))
    return tl.where(keep, tl.exp(x / temperature - top / temperature), 0.0)


@triton.jit
def _topp_hist(x_ptr, max_ptr, n_blocks, n_vocab, cut_ptr, mass_ptr, count_ptr, hit_ptr, SHIFT: tl.constexpr,
               BLOCK: tl.constexpr, N_BLOCKS: tl.constexpr, CHUNK: tl.constexpr, BINS: tl.constexpr):
    """One round of the top-p select, a program per block: its tokens' exp(x - max) and count by
    bin 255 - (the 8 key bits at SHIFT) (bin 0 the highest), among those whose higher bits equal
    the ones found so far (cut_ptr); fixed order, so the same sums every run."""
    if tl.load(hit_ptr) == 0:  # the candidates missed the nucleus (else: nothing to do)
        pid = tl.program_id(0)
        b = tl.arange(0, N_BLOCKS)
        top = tl.max(tl.load(max_ptr + b, mask=b < n_blocks, other=float("-inf")), axis=0).to(tl.float64)
        bins = tl.arange(0, BINS)
        mass = tl.zeros([BINS], dtype=tl.float64)
        count = tl.zeros([BINS], dtype=tl.int32)
        for c in range(0, BLOCK, CHUNK):
            ids = pid * BLOCK + c + tl.arange(0, CHUNK)
            live = ids < n_vocab
            x = tl.load(x_ptr + ids, mask=live, other=float("-inf"))
            u = _ordered(x)
            if SHIFT + 8 < 32:  # (the first round: every token; cut_ptr holds an old draw's cut)
                live &= (u >> (SHIFT + 8)) == tl.load(cut_ptr)
            e = tl.where(x > float("-inf"), tl.exp(x.to(tl.float64) - top), 0.0)
            hit = ((BINS - 1 - ((u >> SHIFT) & (BINS - 1)))[:, None] == bins[None, :]) & live[:, None]
            mass += tl.sum(tl.where(hit, e[:, None], 0.0), axis=0)
            count += tl.sum(hit.to(tl.int32), axis=0)
        tl.store(mass_ptr + pid * BINS + bins, mass)
        tl.store(count_ptr + pid * BINS + bins, count)


@triton.jit
def _topp_choose(mass_ptr, count_ptr, n_blocks, max_ptr, top_p_ptr, cut_ptr, acc_ptr, ties_ptr, hit_ptr,
                 FIRST: tl.constexpr, LAST: tl.constexpr, N_BLOCKS: tl.constexpr, BINS: tl.constexpr,
                 ROWS: tl.constexpr):
    """One round's pick, one program: the blocks' bins added (fixed order), the first bin from the
    top where the mass above the bits found so far (acc_ptr[0]) plus the bins' reaches top_p times
    the total (acc_ptr[1], the first round's sum), its 8 bits appended to cut_ptr. LAST: the cut
    is the threshold's key; of its n ties (each of mass q, ranked by id) the first k stay, k the
    count with above + i * q < top_p * total (i = 0..k-1); each block's share to ties_ptr."""
    if tl.load(hit_ptr) == 0:  # the candidates missed the nucleus (else: nothing to do)
        bins = tl.arange(0, BINS)
        mass = tl.zeros([BINS], dtype=tl.float64)
        count = tl.zeros([BINS], dtype=tl.int32)
        for r in range(0, N_BLOCKS, ROWS):
            b = r + tl.arange(0, ROWS)
            at = b[:, None] * BINS + bins[None, :]
            mass += tl.sum(tl.load(mass_ptr + at, mask=(b < n_blocks)[:, None], other=0.0), axis=0)
            if LAST:
                count += tl.sum(tl.load(count_ptr + at, mask=(b < n_blocks)[:, None], other=0), axis=0)
        if FIRST:
            total = tl.sum(mass, axis=0)
            above = total * 0.0
            cut = tl.load(cut_ptr) * 0
            tl.store(acc_ptr + 1, total)
        else:
            total = tl.load(acc_ptr + 1)
            above = tl.load(acc_ptr)
            cut = tl.load(cut_ptr)
        target = tl.load(top_p_ptr) * total
        cum = above + tl.cumsum(mass, axis=0)
        # rounding short of the target everywhere: the lowest bin
        chosen = tl.minimum(tl.sum((cum < target).to(tl.int32), axis=0), BINS - 1)
        above = tl.sum(tl.where(bins == chosen, cum - mass, 0.0), axis=0)
        cut = cut * BINS + (BINS - 1 - chosen)
        tl.store(cut_ptr, cut)
        tl.store(acc_ptr, above)
        if LAST:
            m = tl.arange(0, N_BLOCKS)
            top = tl.max(tl.load(max_ptr + m, mask=m < n_blocks, other=float("-inf")), axis=0).to(tl.float64)
            ordered = (cut - 2 ** 31).to(tl.int32)
            v = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True).to(tl.float64)
            q = tl.where(v > float("-inf"), tl.exp(v - top), 0.0)
            n = tl.sum(tl.where(bins == chosen, count, 0), axis=0)
            # k = ceil((target - above) / q) where q > 0 (then corrected for the division's rounding);
            # ties of mass 0 all stay or all go, as the host's before < top_p for each
            y = tl.minimum((target - above) / tl.where(q > 0, q, 1.0), n + 1.0)
            k = tl.where(q > 0, tl.maximum(y, 0.0).to(tl.int32), tl.where(above < target, n, 0))
            k += ((q > 0) & (above + k.to(tl.float64) * q < target)).to(tl.int32)
            k += ((q > 0) & (above + k.to(tl.float64) * q < target)).to(tl.int32)
            k -= ((q > 0) & (k > 0) & (above + (k - 1).to(tl.float64) * q >= target)).to(tl.int32)
            k = tl.minimum(k, n)
            before = k * 0
            for r in range(0, N_BLOCKS, ROWS):
                b = r + tl.arange(0, ROWS)
                c = tl.load(count_ptr + b * BINS + chosen, mask=b < n_blocks, other=0)
                mine = tl.minimum(tl.maximum(k - before - (tl.cumsum(c, axis=0) - c), 0), c)
                tl.store(ties_ptr + b, mine, mask=b < n_blocks)
                before += tl.sum(c, axis=0)


@triton.jit(do_not_specialize=["store"])
def _full_sums(x_ptr, max_ptr, n_blocks, n_vocab, temperature_ptr, min_p_ptr, cut_ptr, ties_ptr, sum_ptr, w_ptr,
               store, BLOCK: tl.constexpr, N_BLOCKS: tl.constexpr, TOP_P: tl.constexpr):
    pid = tl.program_id(0)
    b = tl.arange(0, N_BLOCKS)
    top = tl.max(tl.load(max_ptr + b, mask=b < n_blocks, other=float("-inf")), axis=0).to(tl.float64)
    ids = pid * BLOCK + tl.arange(0, BLOCK)
    live = ids < n_vocab
    w = _full_weights(x_ptr, ids, live, top, temperature_ptr, min_p_ptr, cut_ptr, ties_ptr, pid, TOP_P)
    tl.store(sum_ptr + pid, tl.sum(w, axis=0))
    if store != 0:  # probabilities(): every token's weight
        tl.store(w_ptr + ids, w, mask=live)


@triton.jit(do_not_specialize=["push", "advance"])
def _full_pick(x_ptr, max_ptr, sum_ptr, n_blocks, n_vocab, temperature_ptr, min_p_ptr, cut_ptr, ties_ptr, hit_ptr,
               seed_ptr, draws_ptr, ring_ptr, slot_ptr, window_ptr, counts_ptr, token_ptr, out_ptr, push, advance,
               BLOCK: tl.constexpr, N_BLOCKS: tl.constexpr, TOP_P: tl.constexpr):
    # every state read before any write (the program's warps do not run in step)
    draws = tl.load(draws_ptr)
    slot = tl.load(slot_ptr)
    old = tl.load(ring_ptr + slot)
    fed = tl.load(token_ptr)
    b = tl.arange(0, N_BLOCKS)
    top = tl.max(tl.load(max_ptr + b, mask=b < n_blocks, other=float("-inf")), axis=0).to(tl.float64)
    bsum = tl.load(sum_ptr + b, mask=b < n_blocks, other=0.0)
    bcdf = tl.cumsum(bsum, axis=0)
    target = _uniform(seed_ptr, draws) * tl.max(bcdf, axis=0)
    # the first block whose cumulative sum exceeds the target (rounding past the total: the last
    # block of mass > 0), then the first token there whose cumulative exp exceeds what is left
    block = tl.sum((bcdf <= target).to(tl.int32), axis=0)
    block = tl.minimum(block, tl.max(tl.where(bsum > 0, b, 0), axis=0))
    target -= tl.sum(tl.where(b == block, bcdf - bsum, 0.0), axis=0)
    r = tl.arange(0, BLOCK)
    ids = block * BLOCK + r
    w = _full_weights(x_ptr, ids, ids < n_vocab, top, temperature_ptr, min_p_ptr, cut_ptr, ties_ptr, block, TOP_P)
    rank = tl.sum((tl.cumsum(w, axis=0) <= target).to(tl.int32), axis=0)
    rank = tl.minimum(rank, tl.max(tl.where(w > 0, r, 0), axis=0))
    # TOP_P: only where the candidates missed the nucleus (a hit: _choose's token stands)
    tl.store(out_ptr, block * BLOCK + rank, mask=(tl.load(hit_ptr) == 0) if TOP_P else True)
    if advance != 0:
        tl.store(draws_ptr, draws + 1)
    if push != 0:
        _commit(ring_ptr, slot_ptr, slot, old, fed, window_ptr, counts_ptr, n_vocab)


class DrawScratch:
    """The fixed buffers of one row's fused draw (a CUDA graph captures their addresses)."""

    def __init__(self, n_vocab: int, device: torch.device, block_tokens: int, cap: int, merge_blocks: int = 1):
        pow2 = lambda n: n > 0 and not n & (n - 1)  # noqa: E731
        if not (pow2(cap) and pow2(block_tokens) and pow2(merge_blocks) and 2 <= cap <= block_tokens):
            raise KernelArgumentError(f"could not size the fused draw: cap={cap}, block_tokens={block_tokens} and "
                             f"merge_blocks={merge_blocks} must be powers of two, 2 <= cap <= block_tokens")
        self.n_vocab, self.block_tokens, self.cap, self.merge_blocks = n_vocab, block_tokens, cap, merge_blocks
        self.n_blocks = triton.cdiv(n_vocab, block_tokens)
        self.keys = torch.empty(self.n_blocks * cap, dtype=torch.long, device=device)
        # merge_blocks > 1: _merge keeps the best cap of each merge_blocks blocks' lists here
        self.n_groups = triton.cdiv(self.n_blocks, merge_blocks) if merge_blocks > 1 else 0
        self.merged = torch.empty(self.n_groups * cap, dtype=torch.long, device=device)
        self.block_max = torch.empty(self.n_blocks, dtype=torch.float32, device=device)
        self.block_sum = torch.empty(self.n_blocks, dtype=torch.float64, device=device)
        self.token = torch.zeros(1, dtype=torch.long, device=device)   # the draw
        self.ids = torch.zeros(cap, dtype=torch.long, device=device)    # the ranked candidates
        self.probs = torch.zeros(cap, dtype=torch.float64, device=device)
        # the full draw's: every token's penalised logit, and (probabilities()) final weight
        self.logits = torch.empty(n_vocab, dtype=torch.float32, device=device)
        self.weights = torch.zeros(n_vocab, dtype=torch.float64, device=device)
        # the top-p select's: each block's bins of mass and count, the key bits found so far (at the
        # end the threshold's key), [mass above them, total], each block's kept ties
        self.bin_mass = torch.empty(self.n_blocks * TOP_P_BINS, dtype=torch.float64, device=device)
        self.bin_count = torch.empty(self.n_blocks * TOP_P_BINS, dtype=torch.int32, device=device)
        self.cut = torch.zeros(1, dtype=torch.long, device=device)
        self.acc = torch.zeros(2, dtype=torch.float64, device=device)
        self.ties = torch.zeros(self.n_blocks, dtype=torch.int32, device=device)
        # the top-p draw's: [the candidates held the nucleus (this draw), how often they did, draws]
        self.hit = torch.zeros(3, dtype=torch.long, device=device)


def fused_draw(s, scratch: DrawScratch, logits: torch.Tensor, fed: torch.Tensor | None,
               advance: bool, nucleus: bool = False) -> torch.Tensor:
    """Draw from DeviceSampler s's buffers over logits [V]; fed ([1] long): the token joining the
    ring first (None: the ring stays); advance: count the draw (else the next draw repeats it).
    nucleus: top_p_draw's first half (the candidates' draw and scratch.hit; the ring and the count
    left to its second half). Returns scratch.token ([1] long)."""
    push = int(fed is not None)
    fed = scratch.token if fed is None else fed  # (not read when push is 0)
    n, cap = scratch.n_blocks, scratch.cap
    _candidates[(n,)](logits.reshape(-1), s.bias, s.counts, s.ring, s.slot, fed, s.penalty,
                      scratch.keys, scratch.block_max, scratch.block_sum, scratch.n_vocab, push,
                      BLOCK=scratch.block_tokens, CAP=cap, num_warps=16)
    keys, n_keys = scratch.keys, n * cap
    if scratch.n_groups:
        _merge[(scratch.n_groups,)](keys, n_keys, scratch.merged, GROUP_KEYS=scratch.merge_blocks * cap, CAP=cap,
                                    num_warps=16)
        keys, n_keys = scratch.merged, scratch.n_groups * cap
    _choose[(1,)](keys, n_keys, scratch.block_max, scratch.block_sum, n, scratch.n_vocab, s.temperature,
                  s.top_k, s.top_p, s.min_p, s.seed, s.draws, s.ring, s.slot, s.window, s.counts, fed,
                  scratch.token, scratch.ids, scratch.probs, scratch.hit, 0 if nucleus else push,
                  0 if nucleus else int(advance), N_KEYS=triton.next_power_of_2(n_keys),
                  N_BLOCKS=triton.next_power_of_2(n), CAP=cap, NUCLEUS=nucleus,
                  num_warps=16)  # the sorts: fewer keys per thread, a third of the compile time
    return scratch.token


def full_draw(s, scratch: DrawScratch, logits: torch.Tensor, fed: torch.Tensor | None, advance: bool,
              store: bool = False, top_p: bool = False) -> torch.Tensor:
    """fused_draw's contract for the full draw (every token a candidate: top_k 0, top_p 1; top_p:
    the top-p draw, top_k 0 and s.top_p < 1); store: also every token's final weight in
    scratch.weights (their sum: scratch.block_sum's)."""
    push = int(fed is not None)
    fed = scratch.token if fed is None else fed  # (not read when push is 0)
    n, block = scratch.n_blocks, scratch.block_tokens
    n_pow2 = triton.next_power_of_2(n)
    _full_logits[(n,)](logits.reshape(-1), s.bias, s.counts, s.ring, s.slot, fed, s.penalty, scratch.logits,
                       scratch.block_max, scratch.n_vocab, push, BLOCK=block, num_warps=4)
    if top_p:
        for shift in range(24, -1, -8):
            _topp_hist[(n,)](scratch.logits, scratch.block_max, n, scratch.n_vocab, scratch.cut, scratch.bin_mass,
                             scratch.bin_count, scratch.hit, SHIFT=shift, BLOCK=block, N_BLOCKS=n_pow2,
                             CHUNK=min(block, TOP_P_CHUNK), BINS=TOP_P_BINS, num_warps=8)
            _topp_choose[(1,)](scratch.bin_mass, scratch.bin_count, n, scratch.block_max, s.top_p, scratch.cut,
                               scratch.acc, scratch.ties, scratch.hit, FIRST=shift == 24, LAST=shift == 0, N_BLOCKS=n_pow2,
                               BINS=TOP_P_BINS, ROWS=min(n_pow2, 16), num_warps=8)
    _full_sums[(n,)](scratch.logits, scratch.block_max, n, scratch.n_vocab, s.temperature, s.min_p, scratch.cut,
                     scratch.ties, scratch.block_sum, scratch.weights, int(store), BLOCK=block, N_BLOCKS=n_pow2,
                     TOP_P=top_p, num_warps=4)
    _full_pick[(1,)](scratch.logits, scratch.block_max, scratch.block_sum, n, scratch.n_vocab, s.temperature,
                     s.min_p, scratch.cut, scratch.ties, scratch.hit, s.seed, s.draws, s.ring, s.slot, s.window, s.counts, fed,
                     scratch.token, push, int(advance), BLOCK=block, N_BLOCKS=n_pow2, TOP_P=top_p, num_warps=8)
    return scratch.token


def top_p_draw(s, scratch: DrawScratch, logits: torch.Tensor, fed: torch.Tensor | None, advance: bool,
               store: bool = False) -> torch.Tensor:
    """The top-p draw (top_k 0, s.top_p < 1): the candidates first (fused_draw, nucleus), then
    full_draw over the top-p prefix, whose select and pick do nothing where the candidates held the
    nucleus (scratch.hit[0]); store: the full draw's weights (written only where they did not)."""
    fused_draw(s, scratch, logits, fed, advance, nucleus=True)
    return full_draw(s, scratch, logits, fed, advance, store, top_p=True)
