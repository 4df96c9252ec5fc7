"""Trunk weights kept as the file's quantized blocks, dequantized per use.

A streamed model's budget is mostly for the expert cache, and a Q8_0 trunk dequantized to f32
is 3.8x its file size (the GPU box's 20 GiB model: 4.5 GiB of f32 trunk left 206 MiB for
experts). QuantLinear keeps the raw blocks and, per call, dequantizes a few rows at a time into
one shared buffer and multiplies them: the f32 copy of a chunk stays in the CPU cache, and no
more than a chunk of f32 weight ever exists. Each output row is the same dot product as with a
resident f32 weight (rows of a matmul are independent), so the logits are the same bits - with
one caveat measured on x86 MKL: the BLAS handles a tail of rows (count not a multiple of 4) by a
different path, so a weight with such a row count can differ from the f32 one by float rounding.
Real models' dimensions are multiples of 64; the streamed == resident tests cover every arch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gguf.constants import GGMLQuantizationType
from torch import nn

from sparkd.engine.layers.act_round import round_activations
from sparkd.engine.quant_blocks import f16
from sparkd.engine.quants import block_format, dequantize

# f32 values dequantized per step: 4 MiB, big enough to amortise a call, small enough for L2/L3
CHUNK_VALUES = 1 << 20
_ROW_MULTIPLE = 64  # chunk boundaries on multiples of 64 rows keep the BLAS on its main path


class Scratch:
    """The one f32 buffer every QuantLinear and QuantEmbedding of a model dequantizes into
    (calls run one after another, on one thread)."""

    def __init__(self, n_values: int = CHUNK_VALUES):
        self.n_values = n_values
        self.buffer = torch.empty(0, dtype=torch.float32)

    def take(self, n_values: int) -> torch.Tensor:
        if self.buffer.numel() < n_values:
            self.buffer = torch.empty(max(n_values, self.n_values), dtype=torch.float32)
        return self.buffer


class QuantRows:
    """A [rows, cols] weight as raw GGUF bytes, any block type; rows dequantize on demand."""

    def __init__(self, raw: torch.Tensor, ggml_type: GGMLQuantizationType, shape: tuple[int, int],
                 scratch: Scratch):
        fmt = block_format(ggml_type)
        self.rows, self.cols = shape
        self.ggml_type, self.scratch = ggml_type, scratch
        if ggml_type == GGMLQuantizationType.Q8_0:
            # quants and scales apart (int8 [R, B, 32], f32 [R, B, 1]): two contiguous passes per
            # use instead of strided ones, 2.2x faster; 1.125 bytes per value instead of 1.0625
            blocks = raw.reshape(-1, fmt.type_size)
            self.q8 = blocks[:, 2:].contiguous().view(torch.int8).view(self.rows, -1, fmt.block_size)
            self.q8_scale = f16(blocks, 0).view(self.rows, -1, 1)
            self.raw = None
        else:
            self.raw = raw.reshape(self.rows, self.cols // fmt.block_size * fmt.type_size)  # uint8
        self.chunk_rows = max(_ROW_MULTIPLE, scratch.n_values // self.cols // _ROW_MULTIPLE * _ROW_MULTIPLE)

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols

    @property
    def device(self) -> torch.device:
        return (self.q8 if self.raw is None else self.raw).device

    def dequantize(self, r0: int, r1: int) -> torch.Tensor:
        """Rows [r0, r1) as f32, in the shared buffer: valid until the next call on the scratch."""
        out = self.scratch.take((r1 - r0) * self.cols)
        if self.raw is None:  # Q8_0: the same f32 operations as quant_blocks.q8_0, so the same bits
            w = out[:(r1 - r0) * self.cols].view(self.q8[r0:r1].shape)
            w.copy_(self.q8[r0:r1])
            return w.mul_(self.q8_scale[r0:r1]).view(r1 - r0, self.cols)
        return dequantize(self.raw[r0:r1], self.ggml_type, (r1 - r0, self.cols), out=out)

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        """Embedding lookup: the f32 rows for token ids [T] → [T, cols] (a new tensor)."""
        flat = ids.reshape(-1)
        out = torch.empty(flat.numel(), self.cols, dtype=torch.float32)
        for i, r in enumerate(flat.tolist()):
            out[i] = self.dequantize(r, r + 1)[0]
        return out.reshape(*ids.shape, self.cols)


class QuantLinear(nn.Module):
    """y = round(x) @ W.T + b like Linear, with W held quantized (QuantRows)."""

    def __init__(self, weight: QuantRows, bias: torch.Tensor | None = None, act_fmt: str | None = None):
        super().__init__()
        self.weight = weight
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.act_fmt = act_fmt

    @property
    def out_features(self) -> int:
        return self.weight.rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xr = round_activations(x, self.act_fmt)
        w = self.weight
        out = torch.empty(*x.shape[:-1], w.rows, dtype=torch.float32)
        for r0 in range(0, w.rows, w.chunk_rows):
            r1 = min(w.rows, r0 + w.chunk_rows)
            b = None if self.bias is None else self.bias[r0:r1]
            out[..., r0:r1] = F.linear(xr, w.dequantize(r0, r1), b)
        return out

    def grouped(self, x: torch.Tensor) -> torch.Tensor:
        """Linear.grouped with the rows dequantized per use."""
        T, G, _ = x.shape
        xr, w = round_activations(x, self.act_fmt), self.weight
        R = w.rows // G
        out = torch.empty(T, G, R, dtype=torch.float32)
        for g in range(G):
            for r0 in range(0, R, w.chunk_rows):
                r1 = min(R, r0 + w.chunk_rows)
                out[:, g, r0:r1] = F.linear(xr[:, g], w.dequantize(g * R + r0, g * R + r1))
        return out
