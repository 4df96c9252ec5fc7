"""Block dequantizers for the codebook ("i-quant") families: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS.

The codebooks (grids of 4 or 8 values per index) and the sign table are taken from the gguf
package at first use rather than retyped: they are data, and a typo in 2048 x 8 values would
only show as a slightly wrong model. Shapes: blocks [N, type_size] uint8 -> [N, 256] float32.
"""

from __future__ import annotations

import functools

import torch
from gguf import quants as gq

from sparkd.engine.quant_blocks import bits, f16, nibbles, u16, u32, unpack


@functools.cache
def _grid(family: str, device: torch.device) -> torch.Tensor:
    """The family's codebook as float32 [entries, values per entry]."""
    cls = getattr(gq, family)
    cls.init_grid()
    return torch.from_numpy(cls.grid.reshape(cls.grid_shape).copy()).to(device)


@functools.cache
def _sign_table(device: torch.device) -> torch.Tensor:
    """ksigns: 7 stored sign bits + even-parity 8th -> [128, 8] of +1/-1."""
    ksigns = torch.tensor(list(gq.IQ2_XXS.ksigns), dtype=torch.uint8, device=device)
    return _signs_from_bits(ksigns)


def _signs_from_bits(x: torch.Tensor) -> torch.Tensor:
    """Explicit sign bytes [..., k] -> [..., k, 8] of +1/-1."""
    return torch.where(bits(x, 8) == 0, 1.0, -1.0).to(torch.float32)


def _xxs_signs(aux: torch.Tensor) -> torch.Tensor:
    """Four 7-bit sign indices in the low 28 bits of aux [N, G] -> signs [N, G, 4, 8]."""
    idx = unpack(aux, [0, 7, 14, 21], 0x7F).transpose(-1, -2)  # [N, G, 4]
    return _sign_table(aux.device)[idx.long()]


def iq2_xxs(b: torch.Tensor) -> torch.Tensor:
    # d f16 | 8 x (u8 grid index[4] | u32: 4 x 7-bit sign index, 4-bit scale)
    n = b.shape[0]
    aux = u32(b, 2, 16).reshape(n, 8, 2)[..., 1]
    db = (f16(b, 0) * (0.5 + (aux >> 28).to(torch.float32)) * 0.25).reshape(n, 8, 1, 1)
    idx = b[:, 2:66].reshape(n, 8, 8)[..., :4]
    grid = _grid("IQ2_XXS", b.device)[idx.long()]  # [N, 8, 4, 8]
    return (db * grid * _xxs_signs(aux)).reshape(n, 256)


def _iq2_scales(d: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """8 bytes of 4-bit scales -> [N, 16, 1, 1] sub-block multipliers d * (0.5 + s) / 4."""
    sc = unpack(scales.reshape(-1, 8, 1), [0, 4], 0xF).reshape(-1, 16)
    return (d * (0.5 + sc.to(torch.float32)) * 0.25).reshape(-1, 16, 1, 1)


def iq2_xs(b: torch.Tensor) -> torch.Tensor:
    # d f16 | qs u16[32] (9-bit grid index, 7-bit sign index) | scales[8]
    n = b.shape[0]
    qs = u16(b, 2, 32)
    signs = _sign_table(b.device)[(qs >> 9).long()].reshape(n, 16, 2, 8)
    grid = _grid("IQ2_XS", b.device)[(qs & 511).long()].reshape(n, 16, 2, 8)
    return (_iq2_scales(f16(b, 0), b[:, 66:74]) * grid * signs).reshape(n, 256)


def iq2_s(b: torch.Tensor) -> torch.Tensor:
    # d f16 | qs[32] | signs[32] | qh[8] (2 high index bits each) | scales[8]
    n = b.shape[0]
    high = unpack(b[:, 66:74].reshape(n, 8, 1), [0, 2, 4, 6], 3).reshape(n, 32)
    idx = b[:, 2:34].to(torch.int32) | (high.to(torch.int32) << 8)
    grid = _grid("IQ2_S", b.device)[idx.long()].reshape(n, 16, 2, 8)
    signs = _signs_from_bits(b[:, 34:66]).reshape(n, 16, 2, 8)
    return (_iq2_scales(f16(b, 0), b[:, 74:82]) * grid * signs).reshape(n, 256)


def iq3_xxs(b: torch.Tensor) -> torch.Tensor:
    # d f16 | qs[64] grid indices | 8 x u32 (4 x 7-bit sign index, 4-bit scale)
    n = b.shape[0]
    aux = u32(b, 66, 8)
    db = (f16(b, 0) * (0.5 + (aux >> 28).to(torch.float32)) * 0.5).reshape(n, 8, 1, 1)
    grid = _grid("IQ3_XXS", b.device)[b[:, 2:66].long()].reshape(n, 8, 4, 8)
    return (db * grid * _xxs_signs(aux)).reshape(n, 256)


def iq3_s(b: torch.Tensor) -> torch.Tensor:
    # d f16 | qs[64] | qh[8] (1 high index bit each) | signs[32] | scales[4]
    n = b.shape[0]
    sc = unpack(b[:, 106:110].reshape(n, 4, 1), [0, 4], 0xF).reshape(n, 8)
    db = (f16(b, 0) * (1 + 2 * sc).to(torch.float32)).reshape(n, 8, 1, 1)
    idx = b[:, 2:66].to(torch.int32) | (bits(b[:, 66:74], 8).reshape(n, 64).to(torch.int32) << 8)
    grid = _grid("IQ3_S", b.device)[idx.long()].reshape(n, 8, 4, 8)
    signs = _signs_from_bits(b[:, 74:106]).reshape(n, 8, 4, 8)
    return (db * grid * signs).reshape(n, 256)


_IQ1_DELTA = 0.125


def iq1_s(b: torch.Tensor) -> torch.Tensor:
    # d f16 | qs[32] | qh u16[8] (4 x 3 high index bits, 3-bit scale, delta sign)
    n = b.shape[0]
    qh = u16(b, 34, 8)
    dl = (f16(b, 0) * (2 * ((qh >> 12) & 7) + 1).to(torch.float32)).reshape(n, 8, 1, 1)
    delta = torch.where((qh & 0x8000) == 0, _IQ1_DELTA, -_IQ1_DELTA).reshape(n, 8, 1, 1)
    high = unpack(qh, [0, 3, 6, 9], 7).transpose(-1, -2)  # [N, 8, 4]
    idx = b[:, 2:34].to(torch.int32).reshape(n, 8, 4) | (high << 8)
    grid = _grid("IQ1_S", b.device)[idx.long()]  # [N, 8, 4, 8]
    return (dl * (grid + delta.to(torch.float32))).reshape(n, 256)


def iq1_m(b: torch.Tensor) -> torch.Tensor:
    # qs[32] | qh[16] (2 x (3 high index bits, delta sign)) | scales u16[4] (3-bit scales;
    # the f16 super-block scale is spread over their top nibbles)
    n = b.shape[0]
    sc = u16(b, 48, 4)
    d_bits = (sc & 0xF000) >> torch.tensor([12, 8, 4, 0], dtype=torch.int32, device=b.device)
    d_bits = d_bits[:, 0] | d_bits[:, 1] | d_bits[:, 2] | d_bits[:, 3]
    d_bytes = torch.stack([d_bits & 0xFF, d_bits >> 8], dim=-1).to(torch.uint8)
    d = d_bytes.view(torch.float16).to(torch.float32)  # [N, 1]
    s = unpack(sc, [0, 3, 6, 9], 7).transpose(-1, -2).reshape(n, 16)
    dl = (d * (2 * s + 1).to(torch.float32)).reshape(n, 8, 2, 1, 1)
    qh = unpack(b[:, 32:48].reshape(n, 16, 1), [0, 4], 0xF).reshape(n, 32).to(torch.int32)
    idx = b[:, :32].to(torch.int32) | ((qh & 7) << 8)
    delta = torch.where((qh & 8) == 0, _IQ1_DELTA, -_IQ1_DELTA).to(torch.float32).reshape(n, 8, 2, 2, 1)
    grid = _grid("IQ1_M", b.device)[idx.long()].reshape(n, 8, 2, 2, 8)
    return (dl * (grid + delta)).reshape(n, 256)


@functools.cache
def _iq4_values(device: torch.device) -> torch.Tensor:
    return torch.tensor(gq.IQ4_NL.kvalues, dtype=torch.float32, device=device)


def iq4_nl(b: torch.Tensor) -> torch.Tensor:
    # d f16 | qs[16] (4-bit indices into a non-linear table); 32 values
    return f16(b, 0) * _iq4_values(b.device)[nibbles(b[:, 2:18]).long()]


def iq4_xs(b: torch.Tensor) -> torch.Tensor:
    # d f16 | scales_h u16 (8 x 2 bits) | scales_l[4] (8 x 4 bits) | qs[128]
    n = b.shape[0]
    low = unpack(b[:, 4:8].reshape(n, 4, 1), [0, 4], 0xF).reshape(n, 8)
    high = unpack(u16(b, 2, 1), list(range(0, 16, 2)), 3).reshape(n, 8)
    dl = (f16(b, 0) * ((low | (high << 4)).to(torch.float32) - 32)).reshape(n, 8, 1)
    q = unpack(b[:, 8:136].reshape(n, 8, 16), [0, 4], 0xF).reshape(n, 8, 32)
    return (dl * _iq4_values(b.device)[q.long()]).reshape(n, 256)
