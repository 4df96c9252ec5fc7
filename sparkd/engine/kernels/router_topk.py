"""The MoE router after its gate GEMV in one kernel: gating (softmax, sigmoid, sqrt-softplus or
none), an optional selection bias, top-k by repeated argmax, the weights gathered from the
unbiased probabilities, then softmax over the selected (gpt-oss), renormalisation (clamped as
llama.cpp does) and scaling. layers/moe.py's Router is the reference; group-limited routing and
given (hash) ids stay there.

A program per token holds the token's E logits in registers (E <= 1024); top_k <= 16 rounds of
argmax pick the experts in descending order, as torch.topk returns them. The ids are distinct and
in [0, E) for any input: a NaN ranks above every number (torch.topk's order) and its weight is
NaN, as the reference's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import pdl
from sparkd.engine.kernels.family import KernelArgumentError
from sparkd.engine.kernels.matmul import tickets

MAX_TOP_K = 16
MAX_EXPERTS = 1024
GATINGS = {"softmax": 0, "sigmoid": 1, "sqrt_softplus": 2, "softmax_weight": 3}  # 3: probs = logits


@triton.jit
def _router_topk(logits_ptr, bias_ptr, w_ptr, ids_ptr, E, logits_row_stride, scale, min_sum,
                 GATING: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
                 SCALE: tl.constexpr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
                 BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    pdl.start(PDL)  # first: pdl's rule
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    live = e < E
    x = tl.load(logits_ptr + t * logits_row_stride + e, mask=live, other=float("-inf"))
    _select(x, e, live, bias_ptr, w_ptr + t * TOP_K, ids_ptr + t * TOP_K, scale, min_sum, GATING, HAS_BIAS,
            NORM, SCALE, TOP_K, BLOCK_K)


@triton.jit
def _log1p(e):
    """log(1 + e) accurate for small e (log(1 + e) alone is 0 once 1 + e rounds to 1, below
    e ~ 6e-8): log(u) * e / (u - 1) with u = 1 + e cancels u's rounding error (Goldberg, 1991)."""
    u = 1.0 + e
    one = u == 1.0  # (the unused branch divides by 1 there, not 0)
    return tl.where(one, e, tl.log(u) * (e / tl.where(one, 1.0, u - 1.0)))


@triton.jit
def _select(x, e, live, bias_ptr, w_ptr, ids_ptr, scale, min_sum, GATING: tl.constexpr,
            HAS_BIAS: tl.constexpr, NORM: tl.constexpr, SCALE: tl.constexpr, TOP_K: tl.constexpr,
            BLOCK_K: tl.constexpr):
    """One token's selection from its logits x [BLOCK_E] (-inf where not live): TOP_K weights
    and ids stored at w_ptr / ids_ptr."""
    if GATING == 0:
        p = tl.exp(x - tl.max(x, axis=0))
        probs = p / tl.sum(p, axis=0)
    elif GATING == 1:
        probs = 1.0 / (1.0 + tl.exp(-x))
    elif GATING == 2:  # torch's softplus: log1p(exp(x)), x itself above 20
        probs = tl.sqrt(tl.where(x > 20.0, x, _log1p(tl.exp(tl.minimum(x, 20.0)))))
    else:
        probs = x
    sel = probs
    if HAS_BIAS:
        sel = probs + tl.load(bias_ptr + e, mask=live, other=0.0)
    # the argmax key ranks NaN first as torch.topk does (tied with +inf, lowest id first) and keeps
    # live lanes above -inf: argmax's NaN compares would otherwise let a padding lane (>= E) win,
    # and the taken and padding lanes (-inf) stay below every live one, so each pick is a new live id
    sel = tl.where(sel != sel, float("inf"), tl.maximum(sel, -3.4028234663852886e38))
    sel = tl.where(live, sel, float("-inf"))
    kk = tl.arange(0, BLOCK_K)
    w = tl.zeros([BLOCK_K], tl.float32)
    ids = tl.zeros([BLOCK_K], tl.int64)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(sel, axis=0)
        w = tl.where(kk == j, tl.sum(tl.where(e == best, probs, 0.0), axis=0), w)
        ids = tl.where(kk == j, best.to(tl.int64), ids)
        sel = tl.where(e == best, float("-inf"), sel)
    chosen = kk < TOP_K
    if GATING == 3:
        w = tl.where(chosen, w, float("-inf"))
        w = tl.exp(w - tl.max(w, axis=0))
        w = w / tl.sum(w, axis=0)
    if NORM:  # clamped as torch's clamp: a NaN sum stays NaN (the GPU's max would return min_sum)
        total = tl.sum(tl.where(chosen, w, 0.0), axis=0)
        w = w / tl.where(total < min_sum, min_sum, total)
    if SCALE:
        w = w * scale
    tl.store(w_ptr + kk, w, mask=chosen)
    tl.store(ids_ptr + kk, ids, mask=chosen)


@triton.jit
def _gate_topk(gate_ptr, x_ptr, part_ptr, ticket_ptr, bias_ptr, w_ptr, ids_ptr, E, D, scale, min_sum,
               GATING: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr, SCALE: tl.constexpr,
               TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
               COLS: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr = False):
    """One token's gate GEMV (float32 W [E, D] @ x) and selection in one launch: program (i, s)
    sums rows tile i over column range s into part[s]; the last program to finish (a ticket
    counted by an acq_rel atomic) adds the SPLIT ranges in order, selects, and resets the ticket."""
    pdl.start(PDL)  # first: pdl's rule
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    per = tl.cdiv(tl.cdiv(D, COLS), SPLIT) * COLS
    acc = tl.zeros((ROWS, COLS), tl.float32)
    for k0 in range(tl.program_id(1) * per, tl.minimum((tl.program_id(1) + 1) * per, D), COLS):
        k = k0 + tl.arange(0, COLS)
        m = (rows[:, None] < E) & (k[None, :] < D)
        w = tl.load(gate_ptr + rows[:, None].to(tl.int64) * D + k[None, :], mask=m, other=0.0)
        acc += w * tl.load(x_ptr + k, mask=k < D, other=0.0)[None, :]
    tl.store(part_ptr + tl.program_id(1) * E + rows, tl.sum(acc, axis=1), mask=rows < E)
    tl.debug_barrier()  # every thread's sums stored before the ticket releases them
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
    if ticket == tl.num_programs(0) * tl.num_programs(1) - 1:
        tl.debug_barrier()
        e = tl.arange(0, BLOCK_E)
        live = e < E
        logits = tl.load(part_ptr + e, mask=live, other=0.0, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT):
            logits += tl.load(part_ptr + s * E + e, mask=live, other=0.0, cache_modifier=".cg")
        _select(tl.where(live, logits, float("-inf")), e, live, bias_ptr, w_ptr, ids_ptr, scale, min_sum,
                GATING, HAS_BIAS, NORM, SCALE, TOP_K, BLOCK_K)
        tl.store(ticket_ptr, 0)


def _check(E: int, top_k: int, gating: str, sel_bias: torch.Tensor | None) -> None:
    if (not 0 < top_k <= min(E, MAX_TOP_K) or E > MAX_EXPERTS or gating not in GATINGS
            or (sel_bias is not None and (sel_bias.shape != (E,) or sel_bias.dtype != torch.float32))):
        raise KernelArgumentError(f"could not run router_topk on {E} experts, top_k {top_k}, gating {gating!r}: "
                                  f"needs <= {MAX_EXPERTS} experts, top_k <= {MAX_TOP_K}, gating one of "
                                  f"{', '.join(GATINGS)} and a float32 [E] bias")


def router_topk(logits: torch.Tensor, top_k: int, gating: str, norm_w: bool, scale: float,
                min_sum: float, sel_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] float32 → (weights [T, top_k] float32, ids [T, top_k] int64) as Router."""
    T, E = logits.shape
    if logits.dtype != torch.float32 or logits.stride(-1) != 1:
        raise KernelArgumentError(f"could not run router_topk on logits {logits.dtype} {list(logits.shape)}: "
                                  f"needs float32 rows")
    _check(E, top_k, gating, sel_bias)
    w = torch.empty(T, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=logits.device)
    block_e = triton.next_power_of_2(E)
    if T:  # one warp holds up to 256 logits: the top_k argmax rounds then need no shared memory
        _router_topk[(T,)](logits, logits if sel_bias is None else sel_bias, w, ids, E, logits.stride(0),
                           scale, min_sum, GATING=GATINGS[gating], HAS_BIAS=sel_bias is not None,
                           NORM=norm_w, SCALE=scale not in (0.0, 1.0), TOP_K=top_k,
                           BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(top_k),
                           num_warps=1 if block_e <= 256 else 4, **pdl.launch(logits.device))
    return w, ids


def gate_topk(weight: torch.Tensor, x: torch.Tensor, top_k: int, gating: str, norm_w: bool, scale: float,
              min_sum: float, sel_bias: torch.Tensor | None = None, cols: int = 256,
              max_split: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's router, gate GEMV included: float32 weight [E, D] and x [1, D] → (weights
    [1, top_k], ids [1, top_k]) as router_topk(x @ weight.T, ...) in one launch. The logits are
    summed per tile of `cols` columns, up to max_split ranges added in order: not the bits of
    torch's matmul, the same bits on every run."""
    E, D = weight.shape
    if (weight.dtype != torch.float32 or not weight.is_contiguous() or x.shape != (1, D)
            or x.dtype != torch.float32 or x.stride(-1) != 1 or weight.device != x.device):
        raise KernelArgumentError(f"could not run the router gate GEMV: needs a contiguous float32 weight [E, D] "
                                  f"and x float32 [1, D] on its device, got {weight.dtype} {list(weight.shape)} "
                                  f"on {weight.device} and x {x.dtype} {list(x.shape)} on {x.device}")
    _check(E, top_k, gating, sel_bias)
    w = torch.empty(1, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(1, top_k, dtype=torch.int64, device=x.device)
    block_e, rows = triton.next_power_of_2(E), 4
    split = max(1, min(max_split, triton.cdiv(D, cols)))
    grid = (triton.cdiv(E, rows), split)
    part = torch.empty(split, E, dtype=torch.float32, device=x.device)
    _gate_topk[grid](weight, x, part, tickets(1, x.device),
                     weight if sel_bias is None else sel_bias, w, ids, E, D, scale, min_sum,
                     GATING=GATINGS[gating], HAS_BIAS=sel_bias is not None, NORM=norm_w,
                     SCALE=scale not in (0.0, 1.0), TOP_K=top_k, BLOCK_E=block_e,
                     BLOCK_K=triton.next_power_of_2(top_k), ROWS=rows, COLS=cols, SPLIT=split,
                     num_warps=1 if block_e <= 256 else 4, **pdl.launch(x.device))
    return w, ids
