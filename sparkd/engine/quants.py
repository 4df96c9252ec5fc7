"""Dequantize GGUF blocks in torch: one table of block layouts, one function per family.

Each family function takes blocks [N, type_size] uint8 and returns [N, block_size] float32,
with the same float32 operation order as gguf-py's numpy reference so results are bit-exact.
Layouts follow llama.cpp's ggml-common.h block structs (offsets noted per function).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from sparkd.engine.errors import ShapeMismatchError, UnsupportedTypeError

# Dequantize this many output values per step: bounds the temporaries (a few x 64 MiB)
# whatever the tensor size, while a step stays large enough to amortise the Python overhead.
_STEP_VALUES = 1 << 24


@dataclass(frozen=True)
class BlockFormat:
    block_size: int  # values per block
    type_size: int  # bytes per block
    dequantize_blocks: Callable[[torch.Tensor], torch.Tensor]


# --- helpers: little-endian fields out of [N, type_size] uint8 blocks ---------------------------
def _f16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The f16 at byte `at` of each block, as float32 [N, 1]."""
    return blocks[:, at:at + 2].contiguous().view(torch.float16).to(torch.float32)


def _plain(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    def dequantize_blocks(blocks: torch.Tensor) -> torch.Tensor:
        return blocks.contiguous().view(dtype).to(torch.float32)
    return dequantize_blocks


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    # d f16 | qs int8[32]
    return blocks[:, 2:].view(torch.int8).to(torch.float32) * _f16(blocks, 0)


FORMATS: dict[T, BlockFormat] = {
    T.F32: BlockFormat(1, 4, _plain(torch.float32)),
    T.F16: BlockFormat(1, 2, _plain(torch.float16)),
    T.BF16: BlockFormat(1, 2, _plain(torch.bfloat16)),
    T.F64: BlockFormat(1, 8, _plain(torch.float64)),
    T.I8: BlockFormat(1, 1, _plain(torch.int8)),
    T.I16: BlockFormat(1, 2, _plain(torch.int16)),
    T.I32: BlockFormat(1, 4, _plain(torch.int32)),
    T.I64: BlockFormat(1, 8, _plain(torch.int64)),
    T.Q8_0: BlockFormat(32, 34, _q8_0),
}

for _t, _fmt in FORMATS.items():  # the table is ours; the gguf package is the cross-check
    if GGML_QUANT_SIZES[_t] != (_fmt.block_size, _fmt.type_size):
        raise ImportError(f"block layout of {_t.name} disagrees with gguf: {GGML_QUANT_SIZES[_t]}")


def block_format(ggml_type: T) -> BlockFormat:
    try:
        return FORMATS[ggml_type]
    except KeyError:
        supported = ", ".join(t.name for t in FORMATS)
        raise UnsupportedTypeError(f"could not dequantize {ggml_type.name}: no dequantizer for this "
                                   f"type (supported: {supported})") from None


def dequantize(raw: torch.Tensor, ggml_type: T, shape: tuple[int, ...] | list[int]) -> torch.Tensor:
    """Raw GGUF bytes (uint8, C order) of a tensor of `shape` (torch order) -> float32 tensor."""
    fmt = block_format(ggml_type)
    n_values = 1
    for dim in shape:
        n_values *= dim
    row = shape[-1] if len(shape) else 1
    expected_bytes = n_values // fmt.block_size * fmt.type_size
    if row % fmt.block_size or raw.numel() != expected_bytes or raw.dtype != torch.uint8:
        raise ShapeMismatchError(
            f"could not dequantize {ggml_type.name} tensor of shape {list(shape)}: expects "
            f"{expected_bytes} uint8 bytes in rows that are multiples of {fmt.block_size}, got "
            f"{raw.numel()} {raw.dtype} values")
    blocks = raw.reshape(-1, fmt.type_size)
    out = torch.empty(blocks.shape[0], fmt.block_size, dtype=torch.float32)
    step_blocks = max(1, _STEP_VALUES // fmt.block_size)
    for start in range(0, blocks.shape[0], step_blocks):
        out[start:start + step_blocks] = fmt.dequantize_blocks(blocks[start:start + step_blocks])
    return out.reshape(tuple(shape))
