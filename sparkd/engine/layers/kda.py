"""Kimi Delta Attention (KDA): linear attention with a per-channel gated delta rule, as Kimi
Linear and Kimi K3 use it, with its per-sequence recurrent state.

Per token and head (Dk = Dv = head_dim): q, k, v come from a projection, a causal depthwise conv
(kernel d_conv, silu) and, for q and k, an L2 norm. The state S [Dk, Dv] decays per key channel,
S *= exp(g), then takes the delta-rule update S += k ⊗ beta·(v - Sᵀk), and the output is
Sᵀq / sqrt(Dk). The output is RMS-normed per head, gated by sigmoid(ssm_g x) and projected.

The cache holds, per KDA layer, the last d_conv-1 inputs of each conv (q, k, v) and S; decoding
one token at a time gives what one pass over the whole sequence gives (rounding apart where a prompt
runs the rule in chunks, delta_rule_chunks: on CUDA by default, $SPARKD_KDA_PROMPT).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sparkd.engine import switches
from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.linear import Linear
from sparkd.engine.layers.norm import RMSNorm


def kda_state_shapes(n_head: int, head_dim: int, d_conv: int) -> list[tuple[int, ...]]:
    """The cache tensors of one KDA layer: conv tails of q, k, v and the delta-rule state."""
    return [(3, d_conv - 1, n_head * head_dim), (n_head, head_dim, head_dim)]


def l2_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    # llama.cpp: rms_norm(x, eps/n) / sqrt(n) = x / sqrt(sum(x²) + eps)
    return x * torch.rsqrt(x.double().pow(2).sum(-1, keepdim=True) + eps).to(x.dtype)


def causal_conv(x: torch.Tensor, tail: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv of x [T, C] after the previous tail [K-1, C]; w [C, K].

    Returns (silu(conv) [T, C], new tail [K-1, C])."""
    K = w.shape[1]
    xc = torch.cat([tail, x])  # [K-1+T, C]
    windows = xc.unfold(0, K, 1)  # [T, C, K]
    out = (windows * w).sum(-1)
    return F.silu(out), xc[xc.shape[0] - (K - 1):]


def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule over T tokens. q, k, v, g: [T, H, D]; beta [T, H]; state [H, Dk, Dv].

    Returns (outputs [T, H, Dv], new state)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = state.clone()
    outs = []
    for t in range(q.shape[0]):
        s = s * torch.exp(g[t])[..., None]  # decay each key channel (row i of S)
        kv = torch.einsum("hij,hi->hj", s, k[t])  # [H, Dv]
        delta = (v[t] - kv) * beta[t][:, None]
        s = s + k[t][..., None] * delta[:, None, :]
        outs.append(torch.einsum("hij,hi->hj", s, q[t]) * scale)
    return torch.stack(outs), s


# A prompt's delta rule ($SPARKD_KDA_PROMPT): "loop" token by token (delta_rule), the order of llama.cpp's fused
# gated-delta-net op on the CPU; "chunks" (session 16) CHUNK (on CUDA CHUNK_CUDA) tokens at a time (delta_rule_chunks,
# ~15 batched ops a chunk). The same function, the sums in another order: float32 rounding apart (test_kimi_k3.py),
# but on the oracle matrix's Q6_K kimi-k3 model (quantized activations amplify rounding on near-ties) top-1
# agreement with llama.cpp fell from >= 45 to 44 of 48 positions with chunks: the CPU, the numeric reference,
# keeps the loop. "auto" (default, session 17): chunks on CUDA, where the loop's 5 small launches a token and
# layer set a prompt's time (the H200: a 4-layer kimi-k3's prompt 3.4-4.5x; docs/performance.md, kda36), the
# loop elsewhere.
PROMPT_RULE = switches.choice("SPARKD_KDA_PROMPT", ("auto", "loop", "chunks"), "auto")
# tokens a chunk: the pairwise decay tensor is [H, C, C, Dk] floats. The 2-core CI machine, one thread, 256
# tokens x 32 heads of 128 (bench/kda_prompt_bench.py, bench/results/kda_prompt_s16_cpu.json): loop 1309 ms,
# chunks of 16 / 32 / 64: 380 / 726 / 1151 ms. The H200 at kimi-k3's 64 heads of 128 (bench/results/
# kda36_h200_s17/): loop 251 ms at 2048 tokens, chunks of 16 / 32 / 64 / 128: 60 / 30 / 23 / 41 ms (the launches
# of short chunks, the [H, C, C, Dk] tensor of long ones), and a 4-layer kimi-k3's prompt 64 >= 32 > 16.
CHUNK = 16
CHUNK_CUDA = 64  # [64, 64, 64, 128] floats: 134 MB a tensor at kimi-k3's heads


def in_chunks(cuda: bool) -> bool:
    """Whether a prompt of several tokens runs the rule in chunks ($SPARKD_KDA_PROMPT) on CUDA or the CPU."""
    return PROMPT_RULE == "chunks" or (PROMPT_RULE == "auto" and cuda)


# Beyond the tensors' bytes on CUDA: the caching allocator rounds each block up to 512 bytes, and the H200 measured
# up to 64.5 KiB over the count (chunks of 64 from a 37-token prompt; bench/results/kda41_h200_s18/).
CUDA_ALLOCATOR_BYTES = 1 << 20


def rule_peak_bytes(T: int, H: int, Dk: int, Dv: int, cuda: bool, elem: int = 4) -> int:
    """The most bytes a prompt's delta rule (T tokens, H heads) allocates at once, the way KDAttention picks, outputs
    and state copy included: what a prompt adds to one KDA layer's other transients (the memory plan's workspace).
    The loop's is bounded by three states at a token's update or, at the end, its outputs stacked."""
    extra = CUDA_ALLOCATOR_BYTES if cuda else 0
    if T == 1 or not in_chunks(cuda):  # KDAttention.forward: one token always loops
        return elem * max(3 * H * Dk * Dv + (T + 2) * H * Dv, H * Dk * Dv + (2 * T + 2) * H * Dv) + extra
    return chunks_peak_bytes(T, H, Dk, Dv, CHUNK_CUDA if cuda else CHUNK, elem) + extra


def chunks_peak_bytes(T: int, H: int, Dk: int, Dv: int, chunk: int, elem: int = 4) -> int:
    """delta_rule_chunks' peak, counted from the code (tests/engine/test_kda_memory.py tracks every tensor and finds
    these bytes exactly where the pairwise phase is the peak): the outputs [T, H, Dv], the state copy, the
    [chunk, chunk] mask, and the larger of a chunk's (C = min(chunk, T)) pairwise phase (B and kd [H, C, C, Dk],
    L and N [H, C, C], einsum's copy of q or k) and its solve-and-update phase, bounded (the solve's copies in)."""
    C = min(chunk, T)
    pairwise = H * C * (C * Dk + 2 * Dk + 2 * C)
    solve = H * C * (3 * Dk + 3 * C + 4 * Dv) + H * Dk
    return elem * (T * H * Dv + H * Dk * Dv + max(pairwise, solve)) + chunk * chunk


def delta_rule_chunks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      state: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """delta_rule, `chunk` tokens at a time. In a chunk from state S0, with B_t the cumulative log decay
    (per key channel) up to token t, the state before token t's update is exp(B_t)·S0 plus the earlier
    updates k_i·d_iᵀ decayed by exp(B_t - B_i), so the updates d_t = beta_t (v_t - S'ᵀk_t) solve one unit
    lower-triangular system (I + diag(beta)·L) D = diag(beta)(V - K̂·S0), L[t, i] = Σ_c k_t k_i exp(B_t - B_i)
    for i < t and K̂ = exp(B)·K; the outputs are Q̂·S0 + N·D with N the same pairs over q and i <= t,
    the state exp(B_last)·S0 + (exp(B_last - B)·K)ᵀ D. Every exponent is <= 0 (g <= 0, i <= t): no
    overflow, whatever the decay."""
    T, H, D = q.shape
    o = v.new_empty(T, H, v.shape[-1])
    s = state.clone()
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)[..., None]  # i > t
    for c0 in range(0, T, chunk):
        qc, kc, vc, gc = (x[c0:c0 + chunk].transpose(0, 1) for x in (q, k, v, g))  # [H, C, D]
        bc = beta[c0:c0 + chunk].transpose(0, 1)[..., None]  # [H, C, 1]
        o[c0:c0 + chunk] = _chunk(qc, kc, vc, gc, bc, s, later).transpose(0, 1)
    return o.mul_(1.0 / math.sqrt(D)), s


def _chunk(qc: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, gc: torch.Tensor, bc: torch.Tensor, s: torch.Tensor,
           later: torch.Tensor) -> torch.Tensor:
    """One chunk of delta_rule_chunks ([H, C, D] inputs, bc [H, C, 1]): its unscaled outputs [H, C, Dv]; the state
    s is updated in place. A function of its own so that its temporaries are freed before the next chunk's."""
    C = qc.shape[1]
    B = gc.cumsum(1)
    # [H, t, i, Dk]: k_i decayed to token t, 0 for i > t; built in place and freed before the next allocation:
    # the one tensor of that size (rule_peak_bytes)
    kd = (B[:, :, None, :] - B[:, None, :, :]).masked_fill_(later[:C, :C], float("-inf")).exp_().mul_(kc[:, None])
    L = torch.einsum("htc,htic->hti", kc, kd)
    N = torch.einsum("htc,htic->hti", qc, kd)
    del kd
    eB = torch.exp(B)
    rhs = torch.baddbmm(vc, eB * kc, s, alpha=-1).mul_(bc)
    # the unit diagonal is implied: diag(beta)·L's strictly lower part is all the solve reads
    d = torch.linalg.solve_triangular(L.mul_(bc), rhs, upper=False, unitriangular=True)
    out = torch.bmm(eB.mul_(qc), s).baddbmm_(N, d)
    last = B[:, -1:, :]
    s.mul_(torch.exp(last).transpose(1, 2)).baddbmm_((last - B).exp_().mul_(kc).transpose(1, 2), d)
    return out


class KDAttention(nn.Module):
    def __init__(self, il: int, n_head: int, head_dim: int, eps: float, wq: Linear, wk: Linear,
                 wv: Linear, conv_q: torch.Tensor, conv_k: torch.Tensor, conv_v: torch.Tensor,
                 f_a: Linear, f_b: Linear, dt_bias: torch.Tensor, a: torch.Tensor, beta: Linear,
                 gate: Linear, out_norm: RMSNorm, wo: Linear, gate_lower_bound: float | None):
        super().__init__()
        self.il, self.n_head, self.head_dim, self.eps = il, n_head, head_dim, eps
        self.wq, self.wk, self.wv = wq, wk, wv
        self.conv = nn.ParameterList([nn.Parameter(c, requires_grad=False) for c in (conv_q, conv_k, conv_v)])
        self.f_a, self.f_b, self.beta, self.gate, self.out_norm, self.wo = f_a, f_b, beta, gate, out_norm, wo
        self.dt_bias = nn.Parameter(dt_bias, requires_grad=False)  # [H*D]
        self.a = nn.Parameter(a, requires_grad=False)  # [H], holds -exp(A_log)
        self.lower_bound = gate_lower_bound

    def _decay(self, x: torch.Tensor) -> torch.Tensor:
        """Log decay g [T, H, D] (<= 0)."""
        f = (self.f_b(self.f_a(x)) + self.dt_bias).view(x.shape[0], self.n_head, self.head_dim)
        a = self.a[:, None]
        if self.lower_bound is not None:  # K3: lb·sigmoid(exp(A_log)·f)
            return self.lower_bound * torch.sigmoid(-(f * a))
        return F.softplus(f) * a  # Kimi Linear: -exp(A_log)·softplus(f)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        # T tokens, H heads, D head_dim; x is the normed layer input [T, n_embd]
        T, H, D = x.shape[0], self.n_head, self.head_dim
        tails, state = cache.state[self.il]
        qkv = []
        for j, proj in enumerate((self.wq, self.wk, self.wv)):
            y, tail = causal_conv(proj(x), tails[j], self.conv[j])
            tails[j] = tail
            qkv.append(y.view(T, H, D))
        q, k, v = l2_normalize(qkv[0], self.eps), l2_normalize(qkv[1], self.eps), qkv[2]
        beta = torch.sigmoid(self.beta(x))  # [T, H]
        if T > 1 and in_chunks(x.is_cuda):
            o, state[:] = delta_rule_chunks(q, k, v, self._decay(x), beta, state, CHUNK_CUDA if x.is_cuda else CHUNK)
        else:
            o, state[:] = delta_rule(q, k, v, self._decay(x), beta, state)
        o = self.out_norm(o) * torch.sigmoid(self.gate(x).view(T, H, D))
        return self.wo(o.reshape(T, H * D))
