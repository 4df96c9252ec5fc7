"""4-bit indices to int8 values of a 16-entry table by byte permutes (PTX prmt, as ggml's CUDA
get_int_from_table_16 does): IQ4_XS's kvalues_iq4nl and MXFP4's doubled e2m1 values, for their dp4a steps.

A table is four int32 words of 4 int8 entries (entries 0-3, 4-7, 8-11, 12-15; entry k in byte k % 4). prmt's
arithmetic twin runs where Triton interprets the kernels (EMU: the interpreter has no PTX).
"""

import os

import triton
import triton.language as tl

from sparkd.engine.kernels.iq_common import word_bytes

# the lookup's EMU for contracts that take none (the prefill GEMM's iblock and fblock; the GEMM reads it too, for its
# bf16 dot): triton.jit picks interpreting or compiling from this same variable when it decorates a function (read
# here as triton reads it; not through triton.knobs, which older triton releases lack)
LOOKUP_EMU = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes"))


@triton.jit
def prmt(a, b, sel, EMU: tl.constexpr):
    """PTX prmt.b32 (default mode): byte n of the result is byte k of {b, a} (a bytes 0-3, b 4-7),
    k the low 3 bits of nibble n of sel. Every selector here has bit 3 of its 4 low nibbles clear
    (set, prmt would fill the byte with its sign bit), which is what EMU's arithmetic twin (the
    interpreter, no PTX) assumes. a, b and sel int32 of one shape."""
    if EMU:
        r = tl.zeros(a.shape, tl.int32)
        for n in tl.static_range(4):
            k = (sel >> (4 * n)) & 7
            byte = (tl.where(k < 4, a, b) >> ((k & 3) * 8)) & 0xFF
            r = r | (byte << (8 * n))
    else:
        r = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, sel], dtype=tl.int32,
                                      is_pure=True, pack=1)
    return r


@triton.jit
def lookup(q, T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr, T3: tl.constexpr, EMU: tl.constexpr):
    """(lo, hi): int32 words of the table values (T0-T3) of the low and of the high nibbles of q's 4 bytes (int32
    words of 8 indices). Each index's low 3 bits pick its entry from both 8-entry halves of the table (two permutes
    of 4 nibbles each), its top bit picks the half (a third permute; 0x3210 plus 4 where the bit is set), and two
    last permutes sort the results into low-nibble and high-nibble words."""
    t0 = tl.full(q.shape, T0, tl.int32)
    t1 = tl.full(q.shape, T1, tl.int32)
    t2 = tl.full(q.shape, T2, tl.int32)
    t3 = tl.full(q.shape, T3, tl.int32)
    q7 = q & 0x77777777  # the entry within a half (bit 3 cleared: no sign fill)
    half = 0x32103210 | ((q >> 1) & 0x44444444)  # byte n of a half's result, or of the other's (+4)
    # a: entries of nibbles 0-3 of q (bytes 0 and 1: lo0, hi0, lo1, hi1), b: of nibbles 4-7
    a = prmt(prmt(t0, t1, q7, EMU), prmt(t2, t3, q7, EMU), half, EMU)
    b = prmt(prmt(t0, t1, q7 >> 16, EMU), prmt(t2, t3, q7 >> 16, EMU), half >> 16, EMU)
    return (prmt(a, b, tl.full(q.shape, 0x6420, tl.int32), EMU),  # bytes 0, 2 of a, then of b
            prmt(a, b, tl.full(q.shape, 0x7531, tl.int32), EMU))


@triton.jit
def block_words(q, T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr, T3: tl.constexpr):
    """A 32-value block's table values as int32 words of 4 int8 [BN, 8], byte j of word w value 4w + j, from its 4
    words of indices q [BN, 4]: the low nibbles of word w are values 4w..4w+3, the high ones 16 + 4w.. (IQ4_XS's and
    MXFP4's layout, Q4_0's too)."""
    lo, hi = lookup(q, T0, T1, T2, T3, LOOKUP_EMU)
    h = tl.arange(0, 2)[None, :, None]
    words = tl.where(h == 0, lo[:, None, :], hi[:, None, :])  # [BN, 2, 4]: word (h, w) holds values 16h + 4w..
    return tl.reshape(words, (q.shape[0], 8))


@triton.jit
def block_values(q, T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr, T3: tl.constexpr):
    """block_words as int8 [BN, 32] (the integer prefill GEMM's iblock)."""
    return word_bytes(block_words(q, T0, T1, T2, T3))
