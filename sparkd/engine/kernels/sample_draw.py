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

The top-p draw (kernels/top_p_select.py; top_k 0 with top_p < 1) is the full draw restricted to
the host's kept prefix: full_draw's select finds, between _full_logits and _full_sums, the key
(_key: logit descending, id ascending, the host's stable order) of the last token the host keeps,
and _full_weights keeps only the tokens whose key is at or above it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels.family import KernelArgumentError

SENTINEL = tl.constexpr(-(2 ** 63))  # below every real key; its id part decodes to 2**31 - 1 (not a token)


@triton.jit
def _key(x, ids):
    """(x descending, id ascending) as an int64 that sorts the same way, descending: the float's
    bits made order-preserving as int32 in the high half, 2**31 - 1 - id in the low half."""
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - ids).to(tl.int64)


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
    """The host's filter_logits keep mask on the ranked candidates."""
    top_p = tl.load(top_p_ptr)
    keep = r < tl.load(top_k_ptr)
    before = tl.cumsum(probs, axis=0) - probs
    keep &= before < tl.where(top_p >= 1.0, float("inf"), top_p)  # the host skips top_p 1
    keep &= probs >= tl.load(min_p_ptr) * tl.max(tl.where(r == 0, probs, 0.0), axis=0)
    return (keep & (ids < n_vocab)) | (r == 0)


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
            out_ptr, ids_out_ptr, probs_out_ptr, push, advance,
            N_KEYS: tl.constexpr, N_BLOCKS: tl.constexpr, CAP: tl.constexpr):
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
def _full_weights(x_ptr, ids, live, top, temperature_ptr, min_p_ptr, cut_ptr, TOP_P: tl.constexpr):
    """The host chain's unnormalised final probabilities of ids: min-p on the softmax of the
    penalised logits (exp(x - max) >= min_p, the best token's being 1), TOP_P: only the kept
    prefix (a key at or above the cut's), then exp(x / T - max / T)."""
    x32 = tl.load(x_ptr + ids, mask=live, other=float("-inf"))
    x = x32.to(tl.float64)
    temperature = tl.load(temperature_ptr)
    keep = (x > float("-inf")) & (tl.exp(x - top) >= tl.load(min_p_ptr))
    if TOP_P:
        keep &= _key(x32, ids) >= tl.load(cut_ptr)
    return tl.where(keep, tl.exp(x / temperature - top / temperature), 0.0)


@triton.jit(do_not_specialize=["store"])
def _full_sums(x_ptr, max_ptr, n_blocks, n_vocab, temperature_ptr, min_p_ptr, cut_ptr, sum_ptr, w_ptr, store,
               BLOCK: tl.constexpr, N_BLOCKS: tl.constexpr, TOP_P: tl.constexpr):
    pid = tl.program_id(0)
    b = tl.arange(0, N_BLOCKS)
    top = tl.max(tl.load(max_ptr + b, mask=b < n_blocks, other=float("-inf")), axis=0).to(tl.float64)
    ids = pid * BLOCK + tl.arange(0, BLOCK)
    live = ids < n_vocab
    w = _full_weights(x_ptr, ids, live, top, temperature_ptr, min_p_ptr, cut_ptr, TOP_P)
    tl.store(sum_ptr + pid, tl.sum(w, axis=0))
    if store != 0:  # probabilities(): every token's weight
        tl.store(w_ptr + ids, w, mask=live)


@triton.jit(do_not_specialize=["push", "advance"])
def _full_pick(x_ptr, max_ptr, sum_ptr, n_blocks, n_vocab, temperature_ptr, min_p_ptr, cut_ptr, seed_ptr,
               draws_ptr, ring_ptr, slot_ptr, window_ptr, counts_ptr, token_ptr, out_ptr, push, advance,
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
    w = _full_weights(x_ptr, ids, ids < n_vocab, top, temperature_ptr, min_p_ptr, cut_ptr, TOP_P)
    rank = tl.sum((tl.cumsum(w, axis=0) <= target).to(tl.int32), axis=0)
    rank = tl.minimum(rank, tl.max(tl.where(w > 0, r, 0), axis=0))
    tl.store(out_ptr, block * BLOCK + rank)
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


def fused_draw(s, scratch: DrawScratch, logits: torch.Tensor, fed: torch.Tensor | None,
               advance: bool) -> torch.Tensor:
    """Draw from DeviceSampler s's buffers over logits [V]; fed ([1] long): the token joining the
    ring first (None: the ring stays); advance: count the draw (else the next draw repeats it).
    Returns scratch.token ([1] long)."""
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
                  scratch.token, scratch.ids, scratch.probs, push, int(advance),
                  N_KEYS=triton.next_power_of_2(n_keys), N_BLOCKS=triton.next_power_of_2(n), CAP=cap,
                  num_warps=16)  # the sorts: fewer keys per thread, a third of the compile time
    return scratch.token


def full_draw(s, scratch: DrawScratch, logits: torch.Tensor, fed: torch.Tensor | None, advance: bool,
              store: bool = False, select=None) -> torch.Tensor:
    """fused_draw's contract for the full draw (every token a candidate: top_k 0, top_p 1); store:
    also every token's final weight in scratch.weights (their sum: scratch.block_sum's); select:
    select(s, scratch) launches what finds the top-p cut over scratch.logits and returns it (a [1]
    long key, kernels/top_p_select.py), None: no cut."""
    push = int(fed is not None)
    fed = scratch.token if fed is None else fed  # (not read when push is 0)
    n, block = scratch.n_blocks, scratch.block_tokens
    n_pow2 = triton.next_power_of_2(n)
    _full_logits[(n,)](logits.reshape(-1), s.bias, s.counts, s.ring, s.slot, fed, s.penalty, scratch.logits,
                       scratch.block_max, scratch.n_vocab, push, BLOCK=block, num_warps=4)
    cut = scratch.token if select is None else select(s, scratch)  # (not read without a select)
    _full_sums[(n,)](scratch.logits, scratch.block_max, n, scratch.n_vocab, s.temperature, s.min_p, cut,
                     scratch.block_sum, scratch.weights, int(store), BLOCK=block, N_BLOCKS=n_pow2,
                     TOP_P=select is not None, num_warps=4)
    _full_pick[(1,)](scratch.logits, scratch.block_max, scratch.block_sum, n, scratch.n_vocab, s.temperature,
                     s.min_p, cut, s.seed, s.draws, s.ring, s.slot, s.window, s.counts, fed, scratch.token, push,
                     int(advance), BLOCK=block, N_BLOCKS=n_pow2, TOP_P=select is not None, num_warps=8)
    return scratch.token
