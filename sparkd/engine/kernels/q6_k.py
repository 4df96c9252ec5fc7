"""Q6_K: 256-value super-blocks (210 bytes): ql[128] | qh[64] | scales int8[16] | d f16.

Sixteen sub-blocks of 16 values with int8 scales; value v = d*scale[v//16]*(q-32), q six bits:
the low four from nibble (v//64)%2 of ql[64*(v//128) + v%64], the high two from bits
2*((v//32)%4) of qh[32*(v//128) + v%32].

The integer step (idot) takes x as Q8_K (act_quant: int8 quants, one f32 scale per 256) and does
llama.cpp's per-block arithmetic. One step covers 4 consecutive l of a 128-value half: the ql
words at l and l+32 and the qh word at l give the four 6-bit words of values l, l+32, l+64, l+96
(nibbles masked with 0x0F0F0F0F, the qh pairs shifted into bits 4-5); each is multiplied with
its x word by dp4a, and the -32 offset by a second dp4a of 0xE0 bytes (-32 as int8) with the same
x word, so sum (q-32)*x stays exact in integers; int8 scales applied in integers, one float step
d * d_x per word tile. The 210-byte blocks are only 2-byte aligned (every other block of a row
starts 2 bytes past a 4-byte boundary), so every 32-bit word is built from two 16-bit loads.

iblock / igroup hand the integer prefill GEMM (prefill_gemm.gemm at "int8", session 10) 32 values as
q - 32 (int8) with the two 16-value scales, and d (Family.ihalf: a tl.dot per 16-value half).
The resident tiled layout (q6_k_tiled) hands the GEMM the same values (its iblock / igroup).

SPARKD_Q6_K_INT=0 (read at import) takes the float path instead (FLOAT_FAMILY: x rounded to Q8_K
by the caller, dequantized values multiplied in float32), the way before session 5.
"""

import dataclasses

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine import switches
from sparkd.engine.kernels.act_quant import Q8_K, dp4a
from sparkd.engine.kernels.family import Family

INT_ENV = "SPARKD_Q6_K_INT"  # "0": the float path (no integer step)
_MINUS32 = tl.constexpr(-522133280)  # 0xE0E0E0E0: four int8 -32s


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 16)[None, :, None]
    t = tl.arange(0, 16)[None, None, :]
    v = s * 16 + t  # [1, 16, 16] value index in the super-block
    h = v // 128
    blk = w_ptr + row_off + g * 210
    d = tl.load((blk + 208).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    sc = tl.load((blk + 192 + s).to(tl.pointer_type(tl.int8)), mask=smask, other=0).to(tl.float32)
    ql = tl.load(blk + 64 * h + v % 64, mask=smask, other=0).to(tl.int32)
    qh = tl.load(blk + 128 + 32 * h + v % 32, mask=smask, other=0).to(tl.int32)
    q = ((ql >> (((v // 64) % 2) * 4)) & 0xF) | (((qh >> (((v // 32) % 4) * 2)) & 3) << 4)
    return (d * sc) * (q.to(tl.float32) - 32.0)


@triton.jit
def _word(hp, m):
    """The 32-bit word whose low half is at int16 pointer hp (2-byte aligned), as int32."""
    lo = tl.load(hp, mask=m, other=0).to(tl.int32) & 0xFFFF
    hi = tl.load(hp + 1, mask=m, other=0).to(tl.int32)
    return lo | (hi << 16)


@triton.jit
def _quarter(q, xw, sc_ptr, m, EMU: tl.constexpr):
    """sc * sum (q - 32) * x over one word of 4 values: q int32 words of 6-bit quants, xw pointers
    to their x words, sc_ptr to their sub-block scales (int8)."""
    x = tl.load(xw)
    sc = tl.load(sc_ptr, mask=m, other=0).to(tl.int32)
    return sc * (dp4a(q, x, EMU) + dp4a(tl.full(q.shape, _MINUS32, tl.int32), x, EMU))


@triton.jit
def _isums(w_ptr, row_off, rmask, xw_ptr, g, EMU: tl.constexpr):
    """Group g's integer sums as [BN, 2, 8] int32: (half h, word w) covers values 128h + 32j + 4w
    .. +3 for j = 0..3 (ql words at 64h + 4w and 64h + 32 + 4w, qh word at 32h + 4w), each
    times its sub-block's scale; also the block start [BN, 1, 1] and the mask [BN, 1, 1]."""
    h = tl.arange(0, 2)[None, :, None]
    w = tl.arange(0, 8)[None, None, :]
    blk = w_ptr + row_off[:, None, None] + g * 210  # [BN, 1, 1]
    m = rmask[:, None, None]
    hp = blk.to(tl.pointer_type(tl.int16)) + 32 * h + 2 * w  # [BN, 2, 8] ql half-words at 64h + 4w
    a = _word(hp, m)  # ql bytes l = 4w..4w+3: low nibbles values l, high nibbles l+64
    b = _word(hp + 16, m)  # ql bytes l+32: low nibbles values l+32, high l+96
    qh = _word(hp + 64 - 16 * h, m)  # qh bytes at 128 + 32h + 4w: bits 2j..2j+1 for value l+32j
    # x words in the weights' own [BN, 2, 8] shape (repeats served by the cache): one register
    # layout for every operand, no conversion through shared memory in the loop
    xw = xw_ptr + g * 64 + 32 * h + w + tl.zeros(a.shape, tl.int32)
    sc = blk.to(tl.pointer_type(tl.int8)) + 192 + 8 * h + w // 4 + tl.zeros(a.shape, tl.int32)
    isum = _quarter((a & 0x0F0F0F0F) | ((qh << 4) & 0x30303030), xw, sc, m, EMU)
    isum += _quarter((b & 0x0F0F0F0F) | ((qh << 2) & 0x30303030), xw + 8, sc + 2, m, EMU)
    isum += _quarter(((a >> 4) & 0x0F0F0F0F) | (qh & 0x30303030), xw + 16, sc + 4, m, EMU)
    isum += _quarter(((b >> 4) & 0x0F0F0F0F) | ((qh >> 2) & 0x30303030), xw + 24, sc + 6, m, EMU)
    return isum, blk, m


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    isum, blk, m = _isums(w_ptr, row_off, rmask, xw_ptr, g, EMU)
    dx = tl.load(xd_ptr + g)
    if EW:  # into the elementwise tile acc [BN, 2, 8]; d loaded in its shape (no layout conversion)
        d = tl.load((blk + 208 + tl.zeros(isum.shape, tl.int32)).to(tl.pointer_type(tl.float16)), mask=m,
                    other=0.0).to(tl.float32)
        acc += isum.to(tl.float32) * (d * dx)
    else:  # the super-block's integer sum, then one float step per row: acc [BN]
        d = tl.load((w_ptr + row_off + g * 210 + 208).to(tl.pointer_type(tl.float16)), mask=rmask,
                    other=0.0).to(tl.float32)
        acc += tl.sum(tl.sum(isum, 2), 1).to(tl.float32) * (d * dx)
    return acc


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock with 16-value scales (Family.ihalf): values 32 (b % 8) .. +31 of group b // 8 as
    (q - 32 int8 [BN, 32], the int8 scale of the first 16 and of the last 16 as int32 [BN])."""
    blk = w_ptr + row_off + (b // 8) * 210  # [BN]
    v = 32 * (b % 8) + tl.arange(0, 32)[None, :]  # [1, 32] value index in the super-block
    h = v // 128
    m = rmask[:, None]
    ql = tl.load(blk[:, None] + 64 * h + v % 64, mask=m, other=0).to(tl.int32)
    qh = tl.load(blk[:, None] + 128 + 32 * h + v % 32, mask=m, other=0).to(tl.int32)
    q = ((ql >> (((v // 64) % 2) * 4)) & 0xF) | (((qh >> (((v // 32) % 4) * 2)) & 3) << 4)
    sc = (blk + 192 + 2 * (b % 8)).to(tl.pointer_type(tl.int8))
    return ((q - 32).to(tl.int8), tl.load(sc, mask=rmask, other=0).to(tl.int32),
            tl.load(sc + 1, mask=rmask, other=0).to(tl.int32))


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    """(d, 0): no min."""
    d = tl.load((w_ptr + row_off + g * 210 + 208).to(tl.pointer_type(tl.float16)), mask=rmask,
                other=0.0).to(tl.float32)
    return d, tl.zeros(d.shape, tl.float32)


FLOAT_FAMILY = Family(T.Q6_K, 256, 210, 16, 16, dequant)
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_K, iacc=(2, 8), isplit=4, iblock=iblock,
                                 igroup=igroup, ihalf=True)
FAMILY = INT_FAMILY if switches.flag(INT_ENV, True) else FLOAT_FAMILY
