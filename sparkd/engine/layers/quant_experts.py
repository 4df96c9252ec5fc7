"""Routed experts kept as raw GGUF blocks (on a CUDA device) and multiplied by the Triton MoE
kernels: the GPU path's expert store for a model whose experts fit.

Each layer's stacked gate/up/down tensors ([E, F, D] / [E, D, F] in torch order) are one buffer
each; expert e starts at e * (its bytes). The offset tables of all E experts are checked and
copied to the device once per layer, and the kernels read a token's selection's rows there
(offsets[ids[a]]), so decode needs no host round trip between the router and the experts and
no gathering launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from sparkd.engine.layers.experts import DOWN, GATE, UP, ExpertWeights, TensorLoader
from sparkd.engine.quants import dequantize
from sparkd.engine.tensors import raw_tensor


@dataclass
class KernelSelection:
    """Selected experts as the MoE decode kernels take them: a prepared table (one entry per
    selected expert, in selection order) and how llama.cpp rounds the gate/up and down inputs."""

    prepared: object  # sparkd.engine.kernels.moe.PreparedTable
    act_gate: str | None
    act_down: str | None


@dataclass
class KernelLayer:
    """One layer's experts for the kernels: the prepared table of all experts and how llama.cpp
    rounds each projection's activations (act_round formats)."""

    prepared: object  # sparkd.engine.kernels.moe.PreparedTable over all E experts
    act_gate: str | None
    act_down: str | None

    def select(self, ids: torch.Tensor):
        """The prepared table restricted to `ids` (int64 [A] on the device), in that order: the
        kernels read offsets[ids] themselves, or (switch "ids" off, layers/moe.DECODE_ON) from
        offsets gathered by torch."""
        from sparkd.engine.layers.moe import DECODE_ON

        sel = self.prepared.select(ids)
        return sel if "ids" in DECODE_ON else sel.gathered()


class KernelExperts:
    """Every routed expert's raw blocks resident on `device`; `kernel_select`/`kernel_table` serve the MoE
    kernels, `get` (dequantized, for layers the kernels cannot run: expert biases, a type without
    a kernel) serves the generic path."""

    def __init__(self, model, device: torch.device | str, load: TensorLoader, act_format):
        from sparkd.engine.kernels import dispatch

        self.model, self.device = model, torch.device(device)
        self._load, self._act = load, act_format
        self._families = dispatch.FAMILIES
        self._layers: dict[int, tuple[dict, KernelLayer | None]] = {}

    def x_format(self, il: int) -> str | None:
        """The int8 block format (act_quant's) the MoE kernels quantize layer il's x to: what the
        norm before the layer may write for them (cuda_graphs.link_norm_quant); None: no integer
        gate/up there."""
        layer = self._layer(il)[1]
        gate_up = None if layer is None else layer.prepared.gate_up
        return gate_up.act_fmt if gate_up is not None and gate_up.idot is not None else None

    def _layer(self, il: int) -> tuple[dict, KernelLayer | None]:
        if il not in self._layers:
            parts = {}
            for name in (GATE, UP, DOWN):
                raw, qtype, shape = raw_tensor(self.model, f"blk.{il}.{name}.weight")
                parts[name] = (raw.to(self.device), qtype, shape)  # shape [E, rows, cols]
            biased = any(f"blk.{il}.{n}.bias" in self.model.tensors for n in (GATE, UP, DOWN))
            self._layers[il] = (parts, None if biased else self._table(il, parts))
        return self._layers[il]

    def _table(self, il: int, parts: dict) -> KernelLayer | None:
        from sparkd.engine.kernels.moe import ExpertTable, prepare

        (g, gt, gs), (u, ut, _), (d, dt, _) = parts[GATE], parts[UP], parts[DOWN]
        if gt != ut or gt not in self._families or dt not in self._families:
            return None
        n, width, dim = gs
        offs = [[e * t.numel() // n for e in range(n)] for t in (g, u, d)]
        table = ExpertTable(g, u, d, *offs, gt, dt, dim, width)
        return KernelLayer(prepare(table, self.device), self._act(f"blk.{il}.{GATE}.weight"),
                           self._act(f"blk.{il}.{DOWN}.weight"))

    def kernel_table(self, il: int) -> KernelLayer | None:
        """All of the layer's experts (prefill groups tokens by expert over this table)."""
        return self._layer(il)[1]

    def kernel_select(self, il: int, ids: torch.Tensor) -> KernelSelection | None:
        """The experts `ids` (int64 [A] on the device) of one token; None: not kernel-able."""
        layer = self._layer(il)[1]
        return None if layer is None else KernelSelection(layer.select(ids), layer.act_gate, layer.act_down)

    def get(self, layer: int, expert_ids: Sequence[int]) -> ExpertWeights:
        parts, _ = self._layer(layer)

        def pick(name: str) -> torch.Tensor:
            raw, qtype, (n, rows, cols) = parts[name]
            per = raw.numel() // n
            return torch.stack([dequantize(raw[e * per:(e + 1) * per], qtype, (rows, cols)) for e in expert_ids])

        def bias(name: str) -> torch.Tensor | None:
            full = f"blk.{layer}.{name}.bias"
            if full not in self.model.tensors:
                return None
            return self._load(full).to(self.device)[list(expert_ids)]
        return ExpertWeights(pick(GATE), pick(UP), pick(DOWN), bias(GATE), bias(UP), bias(DOWN),
                             self._act(f"blk.{layer}.{GATE}.weight"), self._act(f"blk.{layer}.{UP}.weight"),
                             self._act(f"blk.{layer}.{DOWN}.weight"))
