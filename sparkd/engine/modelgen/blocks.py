"""Random weights written straight as GGUF blocks: random bytes for the quants, sane f16 scales.

Any bit pattern is a valid quant for these layouts except the f16 scale fields, so a block is
random bytes with its scale fields overwritten. The scale that gives the wanted standard deviation
is measured once per type by dequantizing a sample with gguf's reference dequantizer — floats are
never quantized, which keeps tens of GB fast (the bytes come from the generator at memory speed).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize

# byte offsets of the f16 fields in one block: (scale offsets, min offsets)
_SCALE_FIELDS: dict[Q, tuple[tuple[int, ...], tuple[int, ...]]] = {
    Q.Q8_0: ((0,), ()), Q.Q4_0: ((0,), ()), Q.Q5_0: ((0,), ()),
    Q.Q4_1: ((0,), (2,)), Q.Q5_1: ((0,), (2,)),
    Q.Q2_K: ((80,), (82,)), Q.Q3_K: ((108,), ()), Q.Q4_K: ((0,), (2,)),
    Q.Q5_K: ((0,), (2,)), Q.Q6_K: ((208,), ()),
    # i-quants: every index fits its grid (IQ1_M's d has no field: set_iq1_m_d)
    Q.IQ2_XXS: ((0,), ()), Q.IQ2_XS: ((0,), ()), Q.IQ3_XXS: ((0,), ()), Q.IQ1_S: ((0,), ()),
    Q.IQ2_S: ((0,), ()), Q.IQ3_S: ((0,), ()),  # 10- and 9-bit indices: every one in the grid
    Q.IQ4_XS: ((0,), ()), Q.IQ4_NL: ((0,), ()),  # any 6-bit scale and 4-bit index is valid
}
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
QUANT_TYPES = tuple(_SCALE_FIELDS) + (Q.IQ1_M, Q.MXFP4)  # no f16 field: IQ1_M's d (set_iq1_m_d), MXFP4's e8m0
_CHUNK_BYTES = 32 << 20  # generate and write in pieces this big to bound memory


def block_size(qtype: Q) -> int:
    return GGML_QUANT_SIZES[qtype][0]


def tensor_nbytes(qtype: Q, n_elements: int) -> int:
    bs, ts = GGML_QUANT_SIZES[qtype]
    return n_elements // bs * ts


def set_iq1_m_d(blocks: np.ndarray, d) -> None:
    """IQ1_M blocks [N, 56] given d (a float, or one per block): its f16 bits are the top nibbles of the four
    scale words (nibble k in byte 49 + 2k); the 3-bit scales below them stay as they are."""
    bits = np.asarray(d, np.float16).view(np.uint16)
    for k in range(4):
        at = 49 + 2 * k
        blocks[:, at] = (blocks[:, at] & 0x0F) | (((bits >> (4 * k)) & 0xF) << 4).astype(np.uint8)


def _fill_scales(blocks: np.ndarray, qtype: Q, d: float, m: float) -> None:
    if qtype == Q.IQ1_M:
        set_iq1_m_d(blocks, d)
        return
    if qtype == Q.MXFP4:  # an e8m0 exponent byte: d to the nearest power of two (the values are 2^(e - 128) * kv)
        blocks[:, 0] = int(np.clip(np.rint(np.log2(d)) + 128, 0, 254))
        return
    scales, mins = _SCALE_FIELDS[qtype]
    for off in scales:
        blocks[:, off:off + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    for off in mins:
        blocks[:, off:off + 2] = np.frombuffer(np.float16(m).tobytes(), np.uint8)


@lru_cache(maxsize=None)
def _calibration(qtype: Q) -> tuple[float, float]:
    """(std with d=1, m=0; mean contributed per unit of m) measured on sample blocks."""
    rng = np.random.default_rng(0)
    ts = GGML_QUANT_SIZES[qtype][1]
    raw = np.frombuffer(rng.bytes(256 * ts), np.uint8).reshape(256, ts).copy()
    _fill_scales(raw, qtype, 1.0, 0.0)
    base = dequantize(raw, qtype)
    mean_per_m = 0.0
    if _SCALE_FIELDS.get(qtype, ((), ()))[1]:
        _fill_scales(raw, qtype, 1.0, 1.0)
        mean_per_m = float(dequantize(raw, qtype).mean() - base.mean())
    centred = base - (base.mean() if mean_per_m else 0.0)
    return float(centred.std()), mean_per_m


def _scales_for(qtype: Q, std: float) -> tuple[float, float]:
    unit_std, mean_per_m = _calibration(qtype)
    d = std / unit_std
    if not mean_per_m:
        return d, 0.0
    # choose the min so the expected value is ~0 (the d-part has a positive mean)
    rng = np.random.default_rng(1)
    ts = GGML_QUANT_SIZES[qtype][1]
    raw = np.frombuffer(rng.bytes(64 * ts), np.uint8).reshape(64, ts).copy()
    _fill_scales(raw, qtype, d, 0.0)
    return d, -float(dequantize(raw, qtype).mean()) / mean_per_m


def random_chunks(rng: np.random.Generator, qtype: Q, n_elements: int, std: float, mean: float = 0.0):
    """Yield the tensor's bytes in chunks: N(mean, std) values (mean only for float types)."""
    if qtype in FLOAT_TYPES:
        step = max(1, _CHUNK_BYTES // 4)
        for start in range(0, n_elements, step):
            n = min(step, n_elements - start)
            x = rng.standard_normal(n, dtype=np.float32) * np.float32(std) + np.float32(mean)
            yield _float_bytes(x, qtype)
        return
    if mean:
        raise ValueError(f"could not write a tensor with mean {mean} as {qtype.name}: keep norms in F32")
    bs, ts = GGML_QUANT_SIZES[qtype]
    d, m = _scales_for(qtype, std)
    n_blocks = n_elements // bs
    step = max(1, _CHUNK_BYTES // ts)
    for start in range(0, n_blocks, step):
        n = min(step, n_blocks - start)
        blocks = np.frombuffer(rng.bytes(n * ts), np.uint8).reshape(n, ts).copy()
        _fill_scales(blocks, qtype, d, m)
        yield blocks


def random_ids(rng: np.random.Generator, shape: tuple[int, ...], upper: int):
    """Yield an int32 [rows, k] table in chunks: each row k distinct ids below `upper`."""
    rows, k = math.prod(shape[:-1]), shape[-1]
    step = max(1, _CHUNK_BYTES // (8 * upper))
    for start in range(0, rows, step):
        n = min(step, rows - start)
        yield rng.random((n, upper), dtype=np.float32).argsort(axis=1)[:, :k].astype(np.int32)


def _float_bytes(x: np.ndarray, qtype: Q) -> np.ndarray:
    if qtype == Q.F32:
        return x
    if qtype == Q.F16:
        return x.astype(np.float16)
    # BF16: round-to-nearest-even on the top 16 bits, as gguf's converter does
    u = x.view(np.uint32)
    return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
