"""IQ4_XS: 256-value super-blocks (136 bytes): d f16 | scales_h u16 | scales_l[4] | qs[128].

Eight sub-blocks of 32 values with 6-bit scales (low four bits: nibble s%2 of scales_l[s//2];
high two: bits 2s of scales_h); value = d*(scale-32)*kvalues[q] with q a 4-bit index (low
nibbles of qs[16s:16s+16] for values 0..15 of sub-block s, high nibbles for 16..31) into
ggml's non-linear table kvalues_iq4nl, looked up here from two 64-bit constants (8 int8
entries each) instead of memory.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family

# kvalues_iq4nl = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113),
# entry k of each half in byte k (little-endian), as signed int64 constants
_KV_LO = tl.constexpr(-654466911485192063)  # 0xF6EADDCFBFAD9881
_KV_HI = tl.constexpr(0x7159453526190D01)


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
    q = (qs >> ((i // 16) * 4)) & 0xF
    table = tl.where(q < 8, _KV_LO, _KV_HI).to(tl.int64)
    kv = ((table >> ((q % 8) * 8).to(tl.int64)) & 0xFF).to(tl.int32)
    kv = (kv ^ 0x80) - 0x80  # the byte as int8
    return (d * scale.to(tl.float32)) * kv.to(tl.float32)


FAMILY = Family(T.IQ4_XS, 256, 136, 8, 32, dequant)
