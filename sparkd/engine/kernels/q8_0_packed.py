"""Q8_0 resident tensors repacked once at load into a layout the GPU reads in 128-bit loads.

A GGUF Q8_0 block is 34 bytes (f16 scale, 32 int8 quants), so its quants are only 2-byte
aligned and the GEMV reads them as 16-bit halves. Packed, each 256-value group of a row is its
256 quants, then its 8 block scales (f16): 272 bytes, the same as the GGUF group, every group
16-byte aligned, so a block's 32 quants load as 32-bit words, four per instruction. A row that
ends inside a group gets a whole group, zero-filled past its end. Only for tensors that stay
resident (attention, shared experts, output head: models/weights.py packs them when it builds
their KernelLinear); streamed experts keep the GGUF layout they are read in.

The layout is a family of its own (FAMILY, qtype PACKED) that matmul.gemv / gemm run as any
other: the integer step is q8_0.idot's arithmetic (x quantized to Q8_0 blocks, dp4a per word,
one float step per block), so the packed GEMV gives the GGUF one's sums; the GEMM dequantizes
the groups as q8_0.dequant does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels.act_quant import Q8_0, dp4a
from sparkd.engine.kernels.family import Family, KernelArgumentError, LayoutType

GROUP_BYTES = 272  # 256 quants + 8 f16 scales


PACKED = LayoutType("Q8_0_PACKED")


def row_bytes(cols: int) -> int:
    """Bytes per packed row: whole 272-byte groups."""
    return -(-cols // 256) * GROUP_BYTES


@dataclass(frozen=True)
class PackedFamily(Family):
    def row_bytes(self, cols: int) -> int:
        return row_bytes(cols)


@dataclass(frozen=True)
class PackedQ8_0:
    """A [rows, cols] Q8_0 tensor in the packed layout: data uint8 [rows * row_bytes(cols)]."""

    data: torch.Tensor
    rows: int
    cols: int


def pack_raw(raw: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Raw GGUF Q8_0 blocks of W [rows, cols] (on any device) -> the packed bytes, uint8
    [rows * row_bytes(cols)] on the same device."""
    what = "the Q8_0 repacking"
    rows, cols = shape
    if cols <= 0 or cols % 32:
        raise KernelArgumentError(f"could not run {what}: {cols} columns is not a positive multiple of the "
                                  f"Q8_0 block of 32 values")
    n_blocks = cols // 32
    if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != rows * n_blocks * 34:
        raise KernelArgumentError(f"could not run {what}: need {rows * n_blocks * 34} bytes (1-D uint8) for "
                                  f"[{rows}, {cols}], got {raw.dtype} {list(raw.shape)}")
    groups = -(-n_blocks // 8)
    blocks = raw.view(rows, n_blocks, 34)
    if n_blocks % 8:  # the last group's missing blocks: zero quants, zero scales
        blocks = torch.cat([blocks, blocks.new_zeros(rows, groups * 8 - n_blocks, 34)], 1)
    blocks = blocks.view(rows, groups, 8, 34)
    out = torch.empty(rows, groups, GROUP_BYTES, dtype=torch.uint8, device=raw.device)
    out[:, :, :256] = blocks[..., 2:].reshape(rows, groups, 256)
    out[:, :, 256:] = blocks[..., :2].reshape(rows, groups, 16)
    return out.reshape(-1)


def pack(raw: torch.Tensor, shape: tuple[int, int]) -> PackedQ8_0:
    """pack_raw as a PackedQ8_0."""
    return PackedQ8_0(pack_raw(raw, shape), *shape)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    grp = w_ptr + row_off + g * 272  # [BN, 1, 1]
    d = tl.load((grp + 256).to(tl.pointer_type(tl.float16)) + s, mask=smask, other=0.0).to(tl.float32)
    q = tl.load((grp + s * 32 + i).to(tl.pointer_type(tl.int8)), mask=smask, other=0)
    return q.to(tl.float32) * d


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """q8_0.idot on a packed row: group g's 8 blocks x 8 words, its scales after its quants."""
    s = tl.arange(0, 8)[None, :, None]  # block in the group
    b = g * 8 + s  # block index along the row [1, 8, 1]
    w = tl.arange(0, 8)[None, None, :]  # 32-bit word in the block
    bmask = b * 32 < K
    m = rmask[:, None, None] & bmask
    grp = w_ptr + row_off[:, None, None] + g * 272  # [BN, 1, 1], 16-byte aligned
    words = tl.load(grp.to(tl.pointer_type(tl.int32)) + s * 8 + w, mask=m, other=0)  # [BN, 8, 8]
    scales = (grp + 256).to(tl.pointer_type(tl.float16)) + s
    dx = tl.load(xd_ptr + b, mask=bmask, other=0.0)
    if EW:  # into the elementwise tile acc [BN, 8, 8], summed once after the loop
        full = tl.zeros(words.shape, tl.int32)
        xw = tl.load(xw_ptr + b * 8 + w + full, mask=m, other=0)
        d = tl.load(scales, mask=m, other=0.0).to(tl.float32)
        acc += dp4a(words, xw, EMU).to(tl.float32) * (d * dx)
    else:
        xw = tl.load(xw_ptr + b * 8 + w, mask=bmask, other=0)  # [1, 8, 8]
        d = tl.load(scales, mask=m, other=0.0).to(tl.float32)  # [BN, 8, 1]
        isum = tl.sum(dp4a(words, xw, EMU), 2)
        acc += tl.sum(isum.to(tl.float32) * tl.sum(d * dx, 2), 1)
    return acc


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """q8_0.iblock on a packed row: block b is block b % 8 of group b // 8."""
    grp = w_ptr + row_off + (b // 8) * 272  # [BN]
    s = b % 8
    d = tl.load((grp + 256).to(tl.pointer_type(tl.float16)) + s, mask=rmask, other=0.0).to(tl.float32)
    q = tl.load((grp[:, None] + s * 32 + tl.arange(0, 32)[None, :]).to(tl.pointer_type(tl.int8)),
                mask=rmask[:, None], other=0)
    return q, d


FAMILY = PackedFamily(PACKED, 32, 34, 8, 32, dequant, align=16, idot=idot, act_fmt=Q8_0, iacc=(8, 8),
                      iblock=iblock)


def gemv(w: PackedQ8_0, x: torch.Tensor, out: torch.Tensor | None = None, config=None, qx=None) -> torch.Tensor:
    """y = W @ x for one token, W packed (pack): matmul.gemv on the PACKED family (qx: x already
    quantized to Q8_0 blocks, act_quant.QuantX, else the GEMV quantizes it)."""
    from sparkd.engine.kernels.matmul import gemv as run  # matmul imports dispatch, which imports this

    return run(w.data, PACKED, (w.rows, w.cols), x, out=out, config=config, qx=qx)

