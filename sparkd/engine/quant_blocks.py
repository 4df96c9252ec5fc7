"""Block dequantizers for the scale-and-offset families: legacy (Q4_0…Q8_0), K-quants,
ternary (TQ1_0, TQ2_0) and 4-bit float (MXFP4, NVFP4).

Every function maps blocks [N, type_size] uint8 -> values [N, block_size] float32. Byte
offsets are those of llama.cpp's block structs; the float32 operations (and their order)
match gguf-py's numpy reference, which is what makes the results bit-exact.
"""

from __future__ import annotations

import torch

# N blocks; every function's shape comments use [N, ...].


def f16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The f16 at byte `at` of each block, as float32 [N, 1]."""
    return blocks[:, at:at + 2].contiguous().view(torch.float16).to(torch.float32)


def u16(blocks: torch.Tensor, at: int, count: int) -> torch.Tensor:
    """`count` little-endian uint16 from byte `at`, as int32 [N, count]."""
    b = blocks[:, at:at + 2 * count].to(torch.int32).reshape(-1, count, 2)
    return b[..., 0] | (b[..., 1] << 8)


def u32(blocks: torch.Tensor, at: int, count: int) -> torch.Tensor:
    """`count` little-endian uint32 from byte `at`, as int64 [N, count]."""
    b = blocks[:, at:at + 4 * count].to(torch.int64).reshape(-1, count, 4)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def unpack(x: torch.Tensor, shifts: list[int], mask: int) -> torch.Tensor:
    """[..., k] -> [..., len(shifts), k]: field i is (x >> shifts[i]) & mask, in x's dtype
    (uint8 stays uint8 to keep memory traffic low: widen before shifting results left)."""
    s = torch.tensor(shifts, dtype=x.dtype, device=x.device).reshape(-1, 1)
    return (x.unsqueeze(-2) >> s) & mask


def nibbles(x: torch.Tensor) -> torch.Tensor:
    """[N, k] bytes -> [N, 2k]: the k low nibbles, then the k high nibbles."""
    return unpack(x, [0, 4], 0xF).reshape(x.shape[0], -1)


def bits(x: torch.Tensor, count: int) -> torch.Tensor:
    """[..., k] -> [..., k, count]: bit j of every element (LSB first), in x's dtype."""
    s = torch.arange(count, dtype=x.dtype, device=x.device)
    return (x.unsqueeze(-1) >> s) & 1


# --- legacy 32-value blocks ------------------------------------------------------------------
def q4_0(b: torch.Tensor) -> torch.Tensor:
    # d f16 | qs[16]
    return f16(b, 0) * (nibbles(b[:, 2:18]).to(torch.float32) - 8)


def q4_1(b: torch.Tensor) -> torch.Tensor:
    # d f16 | m f16 | qs[16]
    return f16(b, 0) * nibbles(b[:, 4:20]).to(torch.float32) + f16(b, 2)


def _q5(b: torch.Tensor, qh_at: int) -> torch.Tensor:
    high = bits(u32(b, qh_at, 1), 32).reshape(-1, 32)  # [N, 32] bit i -> value i
    return nibbles(b[:, qh_at + 4:qh_at + 20]) | (high << 4)


def q5_0(b: torch.Tensor) -> torch.Tensor:
    # d f16 | qh u32 | qs[16]
    return f16(b, 0) * (_q5(b, 2).to(torch.float32) - 16)


def q5_1(b: torch.Tensor) -> torch.Tensor:
    # d f16 | m f16 | qh u32 | qs[16]
    return f16(b, 0) * _q5(b, 4).to(torch.float32) + f16(b, 2)


def q8_0(b: torch.Tensor) -> torch.Tensor:
    # d f16 | qs int8[32]
    return b[:, 2:].view(torch.int8).to(torch.float32) * f16(b, 0)


# --- K-quants: 256-value super-blocks of 16 or 32-value sub-blocks ----------------------------
def q2_k(b: torch.Tensor) -> torch.Tensor:
    # scales[16] (4-bit scale | 4-bit min) | qs[64] | d f16 | dmin f16
    n = b.shape[0]
    sc = b[:, :16]
    dl = (f16(b, 80) * (sc & 0xF).to(torch.float32)).reshape(n, 16, 1)
    ml = (f16(b, 82) * (sc >> 4).to(torch.float32)).reshape(n, 16, 1)
    q = unpack(b[:, 16:80].reshape(n, 2, 1, 32), [0, 2, 4, 6], 3).reshape(n, 16, 16)
    return (dl * q.to(torch.float32) - ml).reshape(n, 256)


def q3_k(b: torch.Tensor) -> torch.Tensor:
    # hmask[32] | qs[64] | scales[12] (16 x 6-bit) | d f16
    n = b.shape[0]
    low = unpack(b[:, 96:104], [0, 4], 0xF).reshape(n, 16)
    high = unpack(b[:, 104:108], [0, 2, 4, 6], 3).reshape(n, 16)
    dl = (f16(b, 108) * ((low | (high << 4)).to(torch.float32) - 32)).reshape(n, 16, 1)
    ql = unpack(b[:, 32:96].reshape(n, 2, 1, 32), [0, 2, 4, 6], 3).reshape(n, 16, 16)
    qh = unpack(b[:, :32].reshape(n, 1, 32), list(range(8)), 1).reshape(n, 16, 16)
    q = ql.to(torch.int16) - ((qh ^ 1) << 2)  # a clear hmask bit subtracts 4
    return (dl * q.to(torch.float32)).reshape(n, 256)


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes -> 8 six-bit scales and 8 six-bit mins (get_scale_min_k4), as float32 [N, 8]."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0xF) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.to(torch.float32), mn.to(torch.float32)


def _k_apply(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = (f16(b, 0) * sc).reshape(n, 8, 1)
    dm = (f16(b, 2) * mn).reshape(n, 8, 1)
    return (d * q.to(torch.float32) - dm).reshape(n, 256)


def q4_k(b: torch.Tensor) -> torch.Tensor:
    # d f16 | dmin f16 | scales[12] | qs[128]
    n = b.shape[0]
    return _k_apply(b, unpack(b[:, 16:144].reshape(n, 4, 32), [0, 4], 0xF).reshape(n, 8, 32))


def q5_k(b: torch.Tensor) -> torch.Tensor:
    # d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
    n = b.shape[0]
    ql = unpack(b[:, 48:176].reshape(n, 4, 32), [0, 4], 0xF).reshape(n, 8, 32)
    qh = unpack(b[:, 16:48].reshape(n, 1, 32), list(range(8)), 1).reshape(n, 8, 32)
    return _k_apply(b, ql | (qh << 4))


def q6_k(b: torch.Tensor) -> torch.Tensor:
    # ql[128] | qh[64] | scales int8[16] | d f16
    n = b.shape[0]
    d = (f16(b, 208) * b[:, 192:208].view(torch.int8).to(torch.float32)).reshape(n, 16, 1)
    ql = unpack(b[:, :128].reshape(n, 2, 64), [0, 4], 0xF).reshape(n, 8, 32)
    qh = unpack(b[:, 128:192].reshape(n, 2, 32), [0, 2, 4, 6], 3).reshape(n, 8, 32)
    q = ((ql | (qh << 4)).to(torch.float32) - 32).reshape(n, 16, 16)
    return (d * q).reshape(n, 256)


# --- ternary ----------------------------------------------------------------------------------
_POW3 = [1, 3, 9, 27, 81]


def _trits(x: torch.Tensor, powers: list[int]) -> torch.Tensor:
    """Base-3 digits packed as fixed-point fractions of a byte: [N, k] -> [N, len(powers) * k]."""
    p = torch.tensor(powers, dtype=torch.uint8, device=x.device).reshape(-1, 1)
    q = (x.unsqueeze(-2) * p).to(torch.int32)  # the uint8 multiply wraps, as in ggml
    return ((q * 3) >> 8).reshape(x.shape[0], -1)


def tq1_0(b: torch.Tensor) -> torch.Tensor:
    # qs[48] (5 trits/byte) | qh[4] (4 trits/byte) | d f16
    q = torch.cat([_trits(b[:, :32], _POW3), _trits(b[:, 32:48], _POW3), _trits(b[:, 48:52], _POW3[:4])], -1)
    return f16(b, 52) * (q.to(torch.float32) - 1)


def tq2_0(b: torch.Tensor) -> torch.Tensor:
    # qs[64] (4 x 2-bit) | d f16
    n = b.shape[0]
    q = unpack(b[:, :64].reshape(n, 2, 32), [0, 2, 4, 6], 3).reshape(n, 256)
    return f16(b, 64) * (q.to(torch.float32) - 1)


# --- 4-bit floats (e2m1 values doubled, as ggml's kvalues_mxfp4) -------------------------------
_E2M1_DOUBLED = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.float32)


def mxfp4(b: torch.Tensor) -> torch.Tensor:
    # e e8m0 | qs[16]; scale is 2^(e-127) halved (ggml_e8m0_to_fp32_half) to undo the doubling
    e = b[:, :1].to(torch.int32)
    scale_bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return scale_bits.view(torch.float32) * _E2M1_DOUBLED.to(b.device)[nibbles(b[:, 1:17]).long()]


def _ue4m3_half_table() -> torch.Tensor:
    """All 256 unsigned e4m3 (bias 7) scale bytes as float32, halved; 0 and 0x7F decode to 0."""
    values = []
    for x in range(256):
        exp, man = (x >> 3) & 0xF, x & 7
        raw = man * 2.0 ** -9 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
        values.append(0.0 if x in (0, 0x7F) else raw * 0.5)
    return torch.tensor(values, dtype=torch.float32)


_UE4M3_HALF = _ue4m3_half_table()


def nvfp4(b: torch.Tensor) -> torch.Tensor:
    # d ue4m3[4] (one per 16 values) | qs[32]
    n = b.shape[0]
    d = _UE4M3_HALF.to(b.device)[b[:, :4].long()].reshape(n, 4, 1)
    q = unpack(b[:, 4:36].reshape(n, 4, 8), [0, 4], 0xF).reshape(n, 4, 16)
    return (d * _E2M1_DOUBLED.to(b.device)[q.long()]).reshape(n, 64)
