"""The one table of quant families with a Triton dequantize-and-multiply, and argument checks
shared by the kernel wrappers (shapes, strides, dtypes, devices, byte bounds)."""

from __future__ import annotations

from typing import Sequence

import torch
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.errors import UnsupportedTypeError
from sparkd.engine.kernels import (half, iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, iq4_nl, iq4_xs,
                                   mxfp4, mxfp4_tiled, q2_k, q3_k, q4_0, q4_0_tiled, q4_k, q4_k_tiled, q5_0, q5_1, q5_k,
                                   q6_k, q6_k_tiled, q8_0, q8_0_packed)
from sparkd.engine.kernels.family import Family, KernelArgumentError

__all__ = ["FAMILIES", "LAYOUTS", "REMAINING", "Family", "KernelArgumentError", "family", "multiplies"]

FAMILIES: dict[T, Family] = {f.qtype: f for f in (*(m.FAMILY for m in (q8_0, q4_k, q6_k, q5_k, q2_k, q3_k, q4_0, iq4_xs,
                                                                       iq2_xxs, iq2_xs, iq3_xxs, iq1_s, iq1_m, iq2_s,
                                                                       iq3_s, mxfp4, q5_0, q5_1, iq4_nl)),
                                                  half.F16, half.BF16)}

# byte layouts the engine makes from a GGUF type at load (not in files): same kernels, own qtype
LAYOUTS: dict[object, Family] = {q8_0_packed.PACKED: q8_0_packed.FAMILY, q4_k_tiled.TILED: q4_k_tiled.FAMILY,
                                 q6_k_tiled.TILED: q6_k_tiled.FAMILY, mxfp4_tiled.TILED: mxfp4_tiled.FAMILY,
                                 q4_0_tiled.TILED: q4_0_tiled.FAMILY}

# Of issue 8's list, still dequantized by torch before a plain matmul: none. Types outside that
# list have kernels too where common files use them (session 24: IQ1_M, IQ2_S, IQ3_S, and MXFP4, gpt-oss's
# experts; session 35: Q5_0, Q5_1 and IQ4_NL, llama-quantize's fallbacks for rows that are not whole 256-value groups,
# such as MLA's 128-wide attn_k_b; session 36: F16 and BF16, the files' unquantized weights); the rest (Q4_1, Q8_1, ...)
# take the torch path; family() names them.
REMAINING: tuple[T, ...] = ()


def multiplies(qtype: T, cols: int) -> bool:
    """Whether the kernels multiply rows of `cols` values of this file type: a family, and rows of whole blocks (a
    quant type's rows always are; F16's and BF16's kernels take runs of 32 values)."""
    return qtype in FAMILIES and cols % FAMILIES[qtype].block_values == 0


def family(qtype: T) -> Family:
    try:
        return FAMILIES[qtype] if qtype in FAMILIES else LAYOUTS[qtype]
    except KeyError:
        have = ", ".join(t.name for t in FAMILIES)
        raise UnsupportedTypeError(f"could not multiply {qtype.name} blocks on the GPU: no Triton kernel "
                                   f"for this type (have {have}); dequantize it with "
                                   f"sparkd.engine.quants instead") from None


def device_of(weight: torch.Tensor, x: torch.Tensor, what: str) -> None:
    """x decides the device; the weight is on it, or (zero-copy) pinned host memory it can read."""
    if weight.device == x.device:
        return
    if weight.device.type == "cpu" and x.device.type == "cuda" and weight.is_pinned():
        return
    raise KernelArgumentError(f"could not run {what}: weight on {weight.device} (pinned="
                              f"{weight.device.type == 'cpu' and weight.is_pinned()}) cannot be read "
                              f"from activations on {x.device}; move it or pin it")


def check_weight(weight: torch.Tensor, what: str, align: int = 2) -> None:
    if weight.dtype != torch.uint8 or weight.dim() != 1 or weight.stride(0) != 1:
        raise KernelArgumentError(f"could not run {what}: weight must be contiguous 1-D uint8 GGUF "
                                  f"blocks, got {weight.dtype} of shape {list(weight.shape)} "
                                  f"strides {list(weight.stride())}")
    if weight.data_ptr() % align:
        raise KernelArgumentError(f"could not run {what}: weight blocks start at {weight.data_ptr():#x}, "
                                  f"not a multiple of {align} bytes as this type's loads need")


def check_cols(fam: Family, cols: int, what: str) -> int:
    """Bytes per row; the row must be whole blocks."""
    if cols <= 0 or cols % fam.block_values:
        raise KernelArgumentError(f"could not run {what}: {cols} columns is not a positive multiple "
                                  f"of the {fam.qtype.name} block of {fam.block_values} values")
    return fam.row_bytes(cols)


def check_matrix(weight: torch.Tensor, fam: Family, shape: tuple[int, int], what: str) -> int:
    """Bytes per row of W [rows, cols] given as exactly its raw blocks in whole row tiles (dequantize's and slab_gemm's
    weight)."""
    rows, cols = shape
    row_bytes = check_cols(fam, cols, what)
    check_weight(weight, what, fam.align)
    if weight.numel() != rows * row_bytes or rows % fam.row_tile:
        raise KernelArgumentError(f"could not run {what}: need {rows * row_bytes} weight bytes in whole tiles of "
                                  f"{fam.row_tile} rows for [{rows}, {cols}], got {weight.numel()} bytes")
    return row_bytes


def check_activations(x: torch.Tensor, cols: int, what: str) -> None:
    if x.dtype != torch.float32:
        raise KernelArgumentError(f"could not run {what}: activations must be float32, got {x.dtype}")
    if x.shape[-1] != cols or x.stride(-1) != 1:
        raise KernelArgumentError(f"could not run {what}: activations of shape {list(x.shape)} strides "
                                  f"{list(x.stride())} need a contiguous last dimension of {cols}")


def offsets_tensor(offsets: Sequence[int] | torch.Tensor, span_bytes: int, weight: torch.Tensor,
                   device: torch.device, what: str, align: int = 2) -> torch.Tensor:
    """Per-expert byte offsets, each checked to leave `span_bytes` inside weight and to be a
    multiple of `align`, as int64 on device."""
    host = torch.as_tensor(offsets, dtype=torch.int64, device="cpu").reshape(-1)
    if host.numel() == 0:
        raise KernelArgumentError(f"could not run {what}: no experts in the offset table")
    low, high = int(host.min()), int(host.max())
    if low < 0 or high + span_bytes > weight.numel() or bool((host % align).any()):
        raise KernelArgumentError(f"could not run {what}: expert byte offsets {host.tolist()} must be "
                                  f"multiples of {align} and leave {span_bytes} bytes inside the {weight.numel()}-byte "
                                  f"weight buffer")
    return host.to(device)


def check_out(out: torch.Tensor | None, shape: tuple[int, ...], device: torch.device, what: str) -> None:
    if out is None:
        return
    if out.dtype != torch.float32 or tuple(out.shape) != shape or out.device != device or not out.is_contiguous():
        raise KernelArgumentError(f"could not run {what}: out must be contiguous float32 {list(shape)} on "
                                  f"{device}, got {out.dtype} {list(out.shape)} on {out.device}")
