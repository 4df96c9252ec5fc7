"""Q8_0 resident tensors repacked once at load into a layout the GPU can read in 128-bit loads.

A GGUF Q8_0 block is 34 bytes (f16 scale, 32 int8 quants), so its quants are only 2-byte
aligned and the GEMV reads them as 16-bit halves. Packed, each row is its quants (cols bytes),
then its block scales (cols/32 f16), padded to 16 bytes: every block's 32 quants start 16-byte
aligned and load as 32-bit words, four per instruction. Only for tensors that stay resident
(attention, shared experts, output head); streamed experts keep the GGUF layout they are read in.

The arithmetic is q8_0.idot's (x quantized to Q8_0 blocks, dp4a per word, one float step per
block), so the packed GEMV gives the same sums as the GGUF one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels import dispatch
from sparkd.engine.kernels.act_quant import Q8_0, dp4a
from sparkd.engine.kernels.matmul import GemvConfig, default_config, igemv


def row_bytes(cols: int) -> int:
    """Bytes per packed row: quants, scales, padding to 16."""
    return -(-(cols + cols // 16) // 16) * 16


@dataclass(frozen=True)
class PackedQ8_0:
    """A [rows, cols] Q8_0 tensor in the packed layout: data uint8 [rows * row_bytes(cols)]."""

    data: torch.Tensor
    rows: int
    cols: int


def pack(raw: torch.Tensor, shape: tuple[int, int]) -> PackedQ8_0:
    """Repack raw GGUF Q8_0 blocks of W [rows, cols] (on any device; the result is on the same)."""
    what = "the Q8_0 repacking"
    rows, cols = shape
    fam = dispatch.family(T.Q8_0)
    gguf_bytes = dispatch.check_cols(fam, cols, what)
    dispatch.check_weight(raw, what, 1)
    if raw.numel() != rows * gguf_bytes:
        raise dispatch.KernelArgumentError(f"could not run {what}: need {rows * gguf_bytes} bytes for "
                                           f"[{rows}, {cols}], got {raw.numel()}")
    blocks = raw.view(rows, cols // 32, 34)
    out = torch.zeros(rows, row_bytes(cols), dtype=torch.uint8, device=raw.device)
    out[:, :cols] = blocks[:, :, 2:].reshape(rows, cols)
    out[:, cols:cols + cols // 16] = blocks[:, :, :2].reshape(rows, cols // 16)
    return PackedQ8_0(out.reshape(-1), rows, cols)


@triton.jit
def idot(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """q8_0.idot on a packed row: group g's 8 blocks x 8 words, scales after the row's quants."""
    b = g * 8 + tl.arange(0, 8)[None, :, None]  # block index along the row [1, 8, 1]
    w = tl.arange(0, 8)[None, None, :]  # 32-bit word in the block
    bmask = b * 32 < K
    m = rmask[:, None, None] & bmask
    row = w_ptr + row_off[:, None, None]  # [BN, 1, 1], 16-byte aligned
    words = tl.load(row.to(tl.pointer_type(tl.int32)) + b * 8 + w, mask=m, other=0)  # [BN, 8, 8]
    scales = (row + K).to(tl.pointer_type(tl.float16)) + b
    dx = tl.load(xd_ptr + b, mask=bmask, other=0.0)
    if EW:  # x and the scales in the words' shape: one register layout, no conversion in the loop
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


def gemv(w: PackedQ8_0, x: torch.Tensor, out: torch.Tensor | None = None,
         config: GemvConfig | None = None) -> torch.Tensor:
    """y = W @ x for one token, W packed (pack); as matmul.gemv with a Q8_0 weight."""
    what = "the packed Q8_0 GEMV"
    dispatch.check_weight(w.data, what, 16)
    dispatch.check_activations(x, w.cols, what)
    dispatch.device_of(w.data, x, what)
    if x.dim() != 1:
        raise dispatch.KernelArgumentError(f"could not run {what}: need x [{w.cols}], got {list(x.shape)}")
    dispatch.check_out(out, (w.rows,), x.device, what)
    y = torch.empty(w.rows, dtype=torch.float32, device=x.device) if out is None else out
    cfg = config or default_config(dispatch.family(T.Q8_0))
    return igemv(w.data, idot, (8, 8), Q8_0, (w.rows, w.cols), row_bytes(w.cols), x, y, cfg)

