"""IQ4_XS: 256-value super-blocks (136 bytes): d f16 | scales_h u16 | scales_l[4] | qs[128].

Eight sub-blocks of 32 values with 6-bit scales (low four bits: nibble s%2 of scales_l[s//2];
high two: bits 2s of scales_h); value = d*(scale-32)*kvalues[q] with q a 4-bit index (low
nibbles of qs[16s:16s+16] for values 0..15 of sub-block s, high nibbles for 16..31) into
ggml's non-linear table kvalues_iq4nl, looked up here from two 64-bit constants (8 int8
entries each) instead of memory.

The integer step (idot) takes x as Q8_K (act_quant: int8 quants, one f32 scale per 256; what
act_round already rounds x to for IQ4_XS, llama.cpp's vec_dot type) and does llama.cpp's per-block
arithmetic: each 32-bit word of qs (4 bytes, 8 indices) becomes two words of int8 table values by
byte permutes (`lookup`: PTX prmt, as ggml's CUDA get_int_from_table_16 does), one for the low
nibbles (values 4w..4w+3 of the sub-block) and one for the high (16+4w..), each multiplied with its
x word by dp4a; the sub-block's scale - 32 applied in integers, one float step d * d_x per word
tile. Blocks are 136 bytes, so rows of whole blocks keep 4-byte alignment: qs and the two header
words load as 32-bit words (Family.align 4).

iblock / igroup hand the integer prefill GEMM (prefill_gemm.gemm / grouped_gemm at "int8", session 22) a sub-block's
table values as int8 (the same `lookup`) with its scale - 32, and a super-block's d: the K-quants' form with a
min and dmin of 0, so the GEMM sums (scale - 32) * isum over the 8 sub-blocks in int32 and adds d_x * d * qsum,
the idot's arithmetic. (Zero mins rather than a flag in matmul: the compiler folds the min term away, the
offline sm_90 PTX never reads x's sums: tests/engine/igemm_compile.py, docs/performance.md session 22.)

SPARKD_IQ4_XS_INT=0 (read at import) takes the float path instead (FLOAT_FAMILY: x rounded to Q8_K
by the caller, dequantized values multiplied in float32), the way before session 21, and prompts the float GEMM
at "ieee" (no iblock), the way before session 22.
"""

import dataclasses

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine import switches
from sparkd.engine.kernels import table16
from sparkd.engine.kernels.act_quant import Q8_K, dp4a, dp4a_add
from sparkd.engine.kernels.family import Family

INT_ENV = "SPARKD_IQ4_XS_INT"  # "0": the float path (no integer step)

# kvalues_iq4nl = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113),
# entry k of each half in byte k (little-endian), as signed int64 constants
_KV_LO = tl.constexpr(-654466911485192063)  # 0xF6EADDCFBFAD9881
_KV_HI = tl.constexpr(0x7159453526190D01)
# the same table as four int32 words of 4 entries (prmt's operands): entries 0-3, 4-7, 8-11, 12-15
_KV0 = tl.constexpr(-1079142271)  # 0xBFAD9881
_KV1 = tl.constexpr(-152379953)  # 0xF6EADDCF
_KV2 = tl.constexpr(0x26190D01)
_KV3 = tl.constexpr(0x71594535)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + g * 136  # [BN, 1, 1]
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    sh = tl.load((blk + 2).to(tl.pointer_type(tl.uint16)), mask=smask, other=0).to(tl.int32)
    sl = tl.load(blk + 4 + s // 2, mask=smask, other=0).to(tl.int32)
    scale = (((sl >> ((s % 2) * 4)) & 0xF) | (((sh >> (2 * s)) & 3) << 4)) - 32
    qs = tl.load(blk + 8 + 16 * s + i % 16, mask=smask, other=0).to(tl.int32)
    return (d * scale.to(tl.float32)) * kvalues((qs >> ((i // 16) * 4)) & 0xF).to(tl.float32)


@triton.jit
def kvalues(q):
    """kvalues_iq4nl[q] (int32) of 4-bit indices q (int32, any shape; also IQ4_NL's)."""
    table = tl.where(q < 8, _KV_LO, _KV_HI).to(tl.int64)
    kv = ((table >> ((q % 8) * 8).to(tl.int64)) & 0xFF).to(tl.int32)
    return (kv ^ 0x80) - 0x80  # the byte as int8


@triton.jit
def lookup(q, EMU: tl.constexpr):
    """(lo, hi): int32 words of the kvalues_iq4nl values of the low and of the high nibbles of q's 4 bytes (int32
    words of qs), by byte permutes (table16.lookup)."""
    return table16.lookup(q, _KV0, _KV1, _KV2, _KV3, EMU)


@triton.jit
def scale(h0, h1, s):
    """The 6-bit scale - 32 of sub-blocks s from the header words h0 (d | scales_h << 16) and h1 (scales_l:
    nibble s holds sub-block s's low four bits), int32."""
    return (((h1 >> (4 * s)) & 0xF) | (((h0 >> (16 + 2 * s)) & 3) << 4)) - 32


@triton.jit
def _isums(w_ptr, row_off, rmask, xw_ptr, g, EMU: tl.constexpr):
    """Group g's integer sums as [BN, 8, 4] int32: (sub-block s, word w) covers values 32s + 4w .. +3
    (low nibbles of qs word 4s + w) and 32s + 16 + 4w .. +3 (its high nibbles), times the sub-block's
    scale - 32; also the block start [BN, 1, 1] and the mask [BN, 1, 1]."""
    s = tl.arange(0, 8)[None, :, None]
    w = tl.arange(0, 4)[None, None, :]
    blk = w_ptr + row_off[:, None, None] + g * 136  # [BN, 1, 1]
    m = rmask[:, None, None]
    q = tl.load((blk + 8).to(tl.pointer_type(tl.int32)) + 4 * s + w, mask=m, other=0)  # [BN, 8, 4]
    lo, hi = lookup(q, EMU)
    # x words in the weights' own shape (repeats served by the cache): no layout conversion in the loop
    xw = xw_ptr + g * 64 + 8 * s + w + tl.zeros(q.shape, tl.int32)
    isum = dp4a_add(hi, tl.load(xw + 4), dp4a(lo, tl.load(xw), EMU), EMU)
    # header words: d | scales_h << 16, then scales_l (nibble s of it: sub-block s's low four bits)
    h0 = tl.load(blk.to(tl.pointer_type(tl.int32)), mask=m, other=0)
    h1 = tl.load((blk + 4).to(tl.pointer_type(tl.int32)), mask=m, other=0)
    d = (h0 & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)  # [BN, 1, 1]
    return isum * scale(h0, h1, s), d  # scale [BN, 8, 1]


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    isum, d = _isums(w_ptr, row_off, rmask, xw_ptr, g, EMU)
    dx = tl.load(xd_ptr + g)
    if EW:  # into the elementwise tile acc [BN, 8, 4]
        acc += isum.to(tl.float32) * (d * dx)
    else:  # the super-block's integer sum, then one float step per row: acc [BN]
        acc += tl.sum(tl.sum(isum, 2), 1).to(tl.float32) * (tl.reshape(d, (d.shape[0],)) * dx)
    return acc


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock with igroup: sub-block b % 8 of super-block b // 8 as its int8 table values [BN, 32] (its 4 qs
    words through `lookup`: the low nibbles of word w are values 4w..4w+3, the high ones 16+4w..), its scale - 32
    (int32 [BN]; 0 for rows not in rmask, so their table values add nothing) and a min of 0 (IQ4_XS has none: the
    GEMM's min term folds away when compiled)."""
    blk = w_ptr + row_off + (b // 8) * 136  # [BN]
    s = b % 8
    q = tl.load((blk + 8 + 16 * s).to(tl.pointer_type(tl.int32))[:, None] + tl.arange(0, 4)[None, :],
                mask=rmask[:, None], other=0)  # [BN, 4]
    v = block_values(q)
    h0 = tl.load(blk.to(tl.pointer_type(tl.int32)), mask=rmask, other=0)
    h1 = tl.load((blk + 4).to(tl.pointer_type(tl.int32)), mask=rmask, other=0)
    return v, tl.where(rmask, scale(h0, h1, s), 0), tl.zeros(rmask.shape, tl.int32)


@triton.jit
def block_values(q):
    """A 32-value block's kvalues_iq4nl values as int8 [BN, 32] from its 4 words of indices q [BN, 4] (table16's;
    also IQ4_NL's iblock)."""
    return table16.block_values(q, _KV0, _KV1, _KV2, _KV3)


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    """(d, 0): no min."""
    d = tl.load((w_ptr + row_off + g * 136).to(tl.pointer_type(tl.float16)), mask=rmask, other=0.0).to(tl.float32)
    return d, tl.zeros(d.shape, tl.float32)


FLOAT_FAMILY = Family(T.IQ4_XS, 256, 136, 8, 32, dequant)
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_K, iacc=(8, 4), align=4, iblock=iblock,
                                 igroup=igroup)
FAMILY = INT_FAMILY if switches.flag(INT_ENV, True) else FLOAT_FAMILY
