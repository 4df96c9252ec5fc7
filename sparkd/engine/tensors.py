"""The one loader for resident tensors: whatever ggml type the file carries, the caller gets
the tensor in torch shape order, dequantized or raw. No per-tensor dtype assumptions, so a
model quantizing a norm or bias to Q8_0 loads like any other ("expected f16, got Q8_0" cannot
happen here)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from gguf.constants import GGMLQuantizationType

from sparkd.engine.errors import ShapeMismatchError, UnsupportedTypeError
from sparkd.engine.gguf_file import GGUFModel, TensorInfo
from sparkd.engine.quants import block_format, dequantize

# Reads a tensor's file bytes as a uint8 tensor; where it puts them is where the result lives
# (the host by default, a device through models/staging.DeviceStager).
Reader = Callable[[TensorInfo], torch.Tensor]


def _check_shape(model: GGUFModel, name: str, shape: tuple[int, ...],
                 expect_shape: tuple[int, ...] | None) -> None:
    if expect_shape is not None and tuple(expect_shape) != shape:
        info = model.tensor(name)
        raise ShapeMismatchError(
            f"could not load tensor {name!r} from {info.path}: shape {list(shape)} does not match "
            f"the {list(expect_shape)} the model's metadata implies", path=info.path, tensor=name,
            offset=info.offset)


def _host_bytes(model: GGUFModel) -> Reader:
    return lambda info: torch.from_numpy(model.read_bytes(info))


def raw_tensor(model: GGUFModel, name: str, expect_shape: tuple[int, ...] | None = None,
               read: Reader | None = None) -> tuple[torch.Tensor, GGMLQuantizationType, tuple[int, ...]]:
    """(uint8 bytes, ggml type, shape in torch order) for code that keeps weights quantized."""
    info = model.tensor(name)
    _check_shape(model, name, info.shape, expect_shape)
    return (read or _host_bytes(model))(info), info.ggml_type, info.shape


def load_tensor(model: GGUFModel, name: str, dtype: torch.dtype = torch.float32,
                expect_shape: tuple[int, ...] | None = None, read: Reader | None = None) -> torch.Tensor:
    """The tensor dequantized to dtype, in torch shape order; any ggml type with a dequantizer.
    Dequantized where `read` puts the bytes (the host by default).

    expect_shape (torch order), if given, is checked before any data is read.
    """
    info = model.tensor(name)
    _check_shape(model, name, info.shape, expect_shape)
    try:
        block_format(info.ggml_type)
    except UnsupportedTypeError as exc:
        raise UnsupportedTypeError(f"could not load tensor {name!r} from {info.path}: {exc}", path=info.path,
                        tensor=name, offset=info.offset) from exc
    raw = (read or _host_bytes(model))(info)
    values = dequantize(raw, info.ggml_type, info.shape)
    return values if dtype == torch.float32 else values.to(dtype)
