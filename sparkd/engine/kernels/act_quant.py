"""Activations quantized on the GPU to the int8 blocks llama.cpp multiplies them in, and the
4-way int8 dot product (dp4a) the integer kernels build on.

llama.cpp converts x to the weight's vec_dot type before a matmul (layers/act_round.py is the
torch version the CPU reference uses): Q8_0 blocks of 32 (scale amax/127 rounded to f16) for
Q8_0 weights, Q8_K blocks of 256 (f32 scale, the value of largest magnitude maps to -127, plus
per-32 sums of the quants for the K-quants' min term) for the K-quants. The kernel below does
the same arithmetic in the same order (IEEE divisions and reciprocals as torch does them, no fused
multiply-add, round half to even), so q * d equals act_round's output bit for bit and the integer kernels compute exactly
llama.cpp's per-block integer sums.

dp4a is PTX inline assembly, which the interpreter cannot run: the wrappers pass EMU=True there
(or when a GPU test asks for it), and the same shifts and multiplies stand in for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import pdl
from sparkd.engine.kernels.family import KernelArgumentError

Q8_0, Q8_K = "q8_0", "q8_k"  # act_round's format names
BLOCKS = {Q8_0: 32, Q8_K: 256}
SUM_LEN = 32  # Q8_K carries the sum of every 32 quants
# (v + 1.5 * 2^23) leaves round-half-even(v) in the low mantissa bits, for |v| < 2^22
_RNE = tl.constexpr(12582912.0)
_RNE_BITS = tl.constexpr(0x4B400000)


@dataclass(frozen=True)
class QuantX:
    """x [R, K] as int8 blocks: words int32 [R, K/4] (4 quants each, little-endian), scales
    float32 [R, K/block], sums int32 [R, K/32] (Q8_K; for Q8_0 a [1, 1] placeholder the kernels never read)."""

    words: torch.Tensor
    scales: torch.Tensor
    sums: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """q * d as float32 [R, K] (what act_round returns; for tests)."""
        q = self.words.view(torch.int8).float()
        block = q.shape[1] // self.scales.shape[1]
        return (q.reshape(q.shape[0], -1, block) * self.scales[..., None]).reshape(q.shape)


@triton.jit
def dp4a(a, b, EMU: tl.constexpr):
    """Elementwise sum over the 4 byte lanes of a * b (int32 words of signed bytes) as int32."""
    a, b = tl.broadcast(a, b)
    c = tl.zeros(a.shape, tl.int32)
    if EMU:
        for i in tl.static_range(4):
            c += ((a << (24 - 8 * i)) >> 24) * ((b << (24 - 8 * i)) >> 24)
    else:
        c = tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                      dtype=tl.int32, is_pure=True, pack=1)
    return c


@triton.jit
def dp4a_add(a, b, c, EMU: tl.constexpr):
    """c + dp4a(a, b) in one instruction (the accumulator of dp4a's asm; int32, exact: the same
    sum as adding after). a, b and c of one shape."""
    if EMU:
        c += dp4a(a, b, EMU)
    else:
        c = tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                      dtype=tl.int32, is_pure=True, pack=1)
    return c


@triton.jit
def _rne(v):
    """round-half-even(v) as int32 (|v| < 2^22); needs the launch's enable_fp_fusion=False."""
    return (v + _RNE).to(tl.int32, bitcast=True) - _RNE_BITS


@triton.jit
def _rcp(v):
    """1 / v, IEEE-rounded. act_round's `c / t` is torch's t.reciprocal() * c (two roundings), and
    the kernel repeats exactly that (llama.cpp divides once: the scales may differ in the last bit)."""
    return tl.math.div_rn(tl.full(v.shape, 1.0, tl.float32), v)


@triton.jit
def quant_blocks(x, K8: tl.constexpr):
    """x float32 [P, BLOCK] -> (quants int32 [P, BLOCK], scales float32 [P]) as act_round rounds
    them: Q8_K (K8) or Q8_0 blocks. Needs the launch's enable_fp_fusion=False."""
    if K8:  # quantize_row_q8_K_ref
        i = tl.arange(0, x.shape[1])[None, :]
        idx = tl.argmax(tl.abs(x), 1, tie_break_left=True)
        mx = tl.sum(tl.where(i == idx[:, None], x, 0.0), 1)  # the signed value of largest magnitude
        nz = mx != 0.0
        iscale = _rcp(tl.where(nz, mx, 1.0)) * -127.0
        q = tl.minimum(_rne(iscale[:, None] * x), 127)
        q = tl.where(nz[:, None], q, 0)
        d = tl.where(nz, _rcp(iscale), 0.0)
    else:  # quantize_row_q8_0
        amax = tl.max(tl.abs(x), 1)
        pos = amax > 0.0
        d = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)).to(tl.float16).to(tl.float32)
        inv = tl.where(pos, _rcp(tl.where(pos, amax, 1.0)) * 127.0, 0.0)
        q = _rne(x * inv[:, None])
    return q, d


@triton.jit
def store_blocks(q_ptr, d_ptr, s_ptr, x, b, m, K8: tl.constexpr):
    """Quantize x [P, BLOCK] (blocks b [P, 1] of a row, m [P, 1] the ones that exist) and store
    them in that row of QuantX's buffers: quants at q_ptr (its words), scales at d_ptr, sums at s_ptr."""
    P: tl.constexpr = x.shape[0]
    BLOCK: tl.constexpr = x.shape[1]
    q, d = quant_blocks(x, K8)
    if K8:
        sums = tl.sum(tl.reshape(q, (P, BLOCK // 32, 32)), 2)  # [P, BLOCK/32]
        j = tl.arange(0, BLOCK // 32)[None, :]
        tl.store(s_ptr + b * (BLOCK // 32) + j, sums, mask=m)
    q_bytes = q_ptr.to(tl.pointer_type(tl.int8))  # the words' buffer, byte by byte
    tl.store(q_bytes + b * BLOCK + tl.arange(0, BLOCK)[None, :], q.to(tl.int8), mask=m)
    tl.store(d_ptr + tl.reshape(b, (P,)), d, mask=tl.reshape(m, (P,)))


@triton.jit
def _quant_kernel(x_ptr, q_ptr, d_ptr, s_ptr, K, n_blocks, BLOCK: tl.constexpr, PER: tl.constexpr,
                  K8: tl.constexpr, PDL: tl.constexpr = False):
    pdl.start(PDL)  # first: pdl's rule
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1) * PER + tl.arange(0, PER)[:, None]  # [PER, 1] block index in the row
    m = b < n_blocks
    x = tl.load(x_ptr + r * K + b * BLOCK + tl.arange(0, BLOCK)[None, :], mask=m, other=0.0)  # [PER, BLOCK]
    store_blocks(q_ptr + r * (K // 4), d_ptr + r * n_blocks, s_ptr + r * (K // 32), x, b, m, K8)


# The attribute a norm's output tensor carries its QuantX in (attach), for the GEMV that reads
# that very tensor next (attached): a plain attribute, so any new tensor made from it has none.
_ATTACHED = "_sparkd_quant_x"


def attach(x: torch.Tensor, q: QuantX, fmt: str) -> torch.Tensor:
    """x, marked as quantized to fmt by q (x's rows, not to be changed in place afterwards)."""
    setattr(x, _ATTACHED, (fmt, q))
    return x


def attached(x: torch.Tensor, fmt: str | None) -> QuantX | None:
    """The QuantX attach() put on x if it is in format fmt, else None."""
    fmt_q = getattr(x, _ATTACHED, None)
    return fmt_q[1] if fmt_q is not None and fmt is not None and fmt_q[0] == fmt else None


def empty(rows: int, cols: int, fmt: str, device: torch.device) -> QuantX:
    """Uninitialised QuantX buffers for [rows, cols] in format fmt."""
    s_shape = (rows, cols // SUM_LEN) if fmt == Q8_K else (1, 1)
    return QuantX(torch.empty(rows, cols // 4, dtype=torch.int32, device=device),
                  torch.empty(rows, cols // BLOCKS[fmt], dtype=torch.float32, device=device),
                  torch.empty(s_shape, dtype=torch.int32, device=device))


def quantize(x: torch.Tensor, fmt: str) -> QuantX:
    """x float32 [R, K] (contiguous, K a multiple of the block) -> QuantX on x's device. No host
    sync and no value-dependent branching: usable inside a CUDA graph capture."""
    what = f"the {fmt} quantization of activations"
    if fmt not in BLOCKS:
        raise KernelArgumentError(f"could not run {what}: format {fmt!r} is not one of {sorted(BLOCKS)}")
    block = BLOCKS[fmt]
    if x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous() or x.shape[1] % block:
        raise KernelArgumentError(f"could not run {what}: need contiguous float32 [rows, K] with K a "
                                  f"multiple of {block}, got {x.dtype} {list(x.shape)}")
    rows, cols = x.shape
    n_blocks = cols // block
    q = empty(rows, cols, fmt, x.device)
    per = 256 // block if x.is_cuda else min(64, triton.next_power_of_2(n_blocks))  # the interpreter: few programs
    _quant_kernel[(rows, triton.cdiv(n_blocks, per))](
        x, q.words, q.scales, q.sums, cols, n_blocks, BLOCK=block, PER=per, K8=fmt == Q8_K,
        enable_fp_fusion=False, num_warps=1, **pdl.launch(x.device))
    return q
