"""Named access to a GGUF model's resident tensors for the architecture builders."""

from __future__ import annotations

from typing import Callable

import torch
from gguf.constants import GGMLQuantizationType

from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.layers.act_round import vec_dot_format
from sparkd.engine.layers.linear import Linear
from sparkd.engine.layers.norm import RMSNorm
from sparkd.engine.layers.qlinear import QuantLinear, QuantRows, Scratch
from sparkd.engine.tensors import load_tensor, raw_tensor

_FLOAT_TYPES = {GGMLQuantizationType.F32, GGMLQuantizationType.F64}


class Weights:
    """quantized: keep projection matrices and the token embedding as the file's blocks
    (QuantLinear, QuantRows) instead of f32; a streamed model does, so its budget goes to experts."""

    def __init__(self, model: GGUFModel, on_read: Callable[[int], None] | None = None,
                 quantized: bool = False):
        self.model = model
        self._on_read = on_read  # called with each tensor's file bytes once it is loaded (progress)
        self.scratch = Scratch() if quantized else None

    def has(self, name: str) -> bool:
        return name in self.model.tensors

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        t = load_tensor(self.model, name, expect_shape=shape)
        if self._on_read is not None:
            self._on_read(self.model.tensor(name).nbytes)
        return t

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.get(name) if self.has(name) else None

    def linear(self, prefix: str, shape: tuple[int, int] | None = None) -> Linear | QuantLinear:
        """`prefix.weight` [out, in] and `prefix.bias` if the file has one."""
        name = f"{prefix}.weight"
        rows = self.rows(name, shape)
        if isinstance(rows, QuantRows):
            return QuantLinear(rows, self.maybe(f"{prefix}.bias"), self.act_format(name))
        return Linear(rows, self.maybe(f"{prefix}.bias"), self.act_format(name))

    def rows(self, name: str, shape: tuple[int, int] | None = None) -> torch.Tensor | QuantRows:
        """A 2-D weight: f32, or QuantRows when this loader keeps weights quantized."""
        info = self.model.tensor(name)
        if self.scratch is None or info.ggml_type in _FLOAT_TYPES or len(info.shape) != 2:
            return self.get(name, shape)
        raw, ggml_type, full_shape = raw_tensor(self.model, name, shape)
        if self._on_read is not None:
            self._on_read(info.nbytes)
        return QuantRows(raw, ggml_type, full_shape, self.scratch)

    def act_format(self, name: str) -> str | None:
        """How llama.cpp rounds the activations multiplied by this weight (see act_round)."""
        return vec_dot_format(self.model.tensor(name).ggml_type)

    def maybe_linear(self, prefix: str) -> Linear | None:
        return self.linear(prefix) if self.has(f"{prefix}.weight") else None

    def norm(self, name: str, eps: float) -> RMSNorm:
        return RMSNorm(self.get(f"{name}.weight"), eps)

    def maybe_norm(self, name: str, eps: float) -> RMSNorm | None:
        return self.norm(name, eps) if self.has(f"{name}.weight") else None
