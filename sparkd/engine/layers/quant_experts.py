"""Routed experts kept as raw GGUF blocks (on a CUDA device) and multiplied by the Triton MoE
kernels: the GPU path's expert store for a model whose experts fit.

Each layer's stacked gate/up/down tensors ([E, F, D] / [E, D, F] in torch order) are one buffer
each; expert e starts at e * (its bytes). The offset tables of all E experts are checked and
copied to the device once per layer, and the kernels read a token's selection's rows there
(offsets[ids[a]]), so decode needs no host round trip between the router and the experts and
no gathering launch.

Session 9 (moe20): a Q4_K layer's gate and up are repacked once at load into the tiled GEMV's pairx
bytes (kernels/moe.tiled_gate_up; the same bytes regrouped inside 4-row tiles, in place), which the
MoE gate/up reads with the pairx step: H200 top-8 gate/up at 7168x2048 48.1 -> 41.4 us (0.65 -> 0.76
of copy bandwidth), layer 73.6 -> 67.9 us. $SPARKD_MOE_GATE_UP_LAYOUT=gguf keeps the file's blocks.
Session 10 (moe21): a Q4_K down the same way from model width TILED_DOWN_MIN_DIM (kernels/moe.tiled_down, the
pairx step in the down launch): H200 top-8 down 32.1 -> 22.3 us at 7168x2048, layer after the norm 72.0 -> 60.8 us
(0.66 -> 0.79 of copy bandwidth); $SPARKD_MOE_DOWN_LAYOUT=gguf keeps the file's blocks. Session 13 (down13): from
width AUTO_DOWN_MIN_DIM (2048) by default, for the prompt's grouped GEMM. Session 25: MXFP4 experts (gpt-oss's) in
kernels/mxfp4_tiled.py's 16-row tiles (kernels/moe.tiled_nibbles; a block's quants one 128-bit load): H200 2880x2880
top-4 layer 68.5 -> 54.7 us with the down in one range, the 12-layer gpt-oss decode 863 -> 972 tok/s;
$SPARKD_MOE_MXFP4_LAYOUT=gguf keeps the file's blocks. Streamed experts (the pinned arena holds the file's bytes) keep
GGUF blocks. Session 26: Q4_0 experts the same way (kernels/q4_0_tiled.py; $SPARKD_MOE_Q4_0_LAYOUT=gguf keeps the file's
blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from gguf import GGMLQuantizationType

from sparkd.engine import switches
from sparkd.engine.layers.experts import DOWN, GATE, UP, ExpertWeights, TensorLoader
from sparkd.engine.quants import dequantize
from sparkd.engine.tensors import raw_tensor

GATE_UP_LAYOUT_ENV = "SPARKD_MOE_GATE_UP_LAYOUT"
DOWN_LAYOUT_ENV = "SPARKD_MOE_DOWN_LAYOUT"
MXFP4_LAYOUT_ENV = "SPARKD_MOE_MXFP4_LAYOUT"
Q4_0_LAYOUT_ENV = "SPARKD_MOE_Q4_0_LAYOUT"
GATE_UP_LAYOUTS = ("tiled", "gguf")
# the down's pairx bytes from this model width (session 10, moe21, H200 top-8 layer after the norm, GGUF down ->
# tiled: 7168x2048 72.0 -> 60.8 us, 4096x1536 34.9 -> 33.1; at 2048x768 16.0 -> 17.5 although the down alone took
# 7.0 -> 6.3 us, and the resident 12-layer 2048-wide Q4_K decode 1413.7 / 1485.5 -> 1391.4 / 1480.3 tok/s)
TILED_DOWN_MIN_DIM = 4096
# "auto" (the default since session 13's down13) tiles the down from this model width: the 12-layer 2048-wide Q4_K
# prompt (H200, prompt graphs) 1.15 / 1.12 / 1.10 / 1.08x at 128 / 512 / 1024 / 2048 tokens, its resident decode
# 0.996x (within the rounds' spread); the prompt's grouped GEMM on the GGUF down at 2048x768 took 645 / 1753 us at
# 512 / 2048 tokens (s13) against pairx's 372 / 999 (prefill28). Not measured below 2048
AUTO_DOWN_MIN_DIM = 2048
# the down's layouts: "tiled" from TILED_DOWN_MIN_DIM (session 10's rule), "all" at every width (session 13, prefill28)
DOWN_LAYOUTS = ("auto", *GATE_UP_LAYOUTS, "all")


def gate_up_layout() -> str:
    """How resident Q4_K experts' gate and up are kept: "tiled" (the pairx bytes, where the tiled GEMV
    runs pairx and the expert width is whole 4-row tiles; the default) or "gguf" ($SPARKD_MOE_GATE_UP_LAYOUT)."""
    return switches.choice(GATE_UP_LAYOUT_ENV, GATE_UP_LAYOUTS, "tiled")


def down_layout() -> str:
    """gate_up_layout for a resident Q4_K down ($SPARKD_MOE_DOWN_LAYOUT): tiled where the model width is at least
    AUTO_DOWN_MIN_DIM ("auto", the default), TILED_DOWN_MIN_DIM ("tiled"), any ("all"); "gguf" nowhere."""
    return switches.choice(DOWN_LAYOUT_ENV, DOWN_LAYOUTS, "auto")


def mxfp4_layout() -> str:
    """How resident MXFP4 experts (gpt-oss's) are kept: "tiled" (kernels/mxfp4_tiled.py's 16-row tiles, a block's
    quants one 128-bit load, where the integer step runs and the rows are whole tiles; the default) or "gguf"
    ($SPARKD_MOE_MXFP4_LAYOUT)."""
    return switches.choice(MXFP4_LAYOUT_ENV, GATE_UP_LAYOUTS, "tiled")


def q4_0_layout() -> str:
    """mxfp4_layout for resident Q4_0 experts (kernels/q4_0_tiled.py; $SPARKD_MOE_Q4_0_LAYOUT)."""
    return switches.choice(Q4_0_LAYOUT_ENV, GATE_UP_LAYOUTS, "tiled")


def down_min_dim(layout: str) -> int | None:
    """The model width from which a down layout tiles the Q4_K down (None: never)."""
    return {"auto": AUTO_DOWN_MIN_DIM, "tiled": TILED_DOWN_MIN_DIM, "all": 0}.get(layout)


@dataclass
class KernelSelection:
    """Selected experts as the MoE decode kernels take them: a prepared table (one entry per
    selected expert, in selection order) and how llama.cpp rounds the gate/up and down inputs."""

    prepared: object  # sparkd.engine.kernels.moe.PreparedTable
    act_gate: str | None
    act_down: str | None
    # moe_decode's bias for `prepared` (the layer's [E, 2F + D]; with gathered offsets [A, 2F + D]), or none
    bias: torch.Tensor | None = None


@dataclass
class KernelLayer:
    """One layer's experts for the kernels: the prepared table of all experts and how llama.cpp
    rounds each projection's activations (act_round formats)."""

    prepared: object  # sparkd.engine.kernels.moe.PreparedTable over all E experts
    act_gate: str | None
    act_down: str | None
    bias: torch.Tensor | None = None  # every expert's gate | up | down biases [E, 2F + D] (gpt-oss), or none

    def select(self, ids: torch.Tensor):
        """The prepared table restricted to `ids` (int64 [A] on the device), in that order: the
        kernels read offsets[ids] themselves, or (switch "ids" off, layers/moe.DECODE_ON) from
        offsets gathered by torch."""
        from sparkd.engine.layers.moe import DECODE_ON

        sel = self.prepared.select(ids)
        return sel if "ids" in DECODE_ON else sel.gathered()


class KernelExperts:
    """Every routed expert's raw blocks resident on `device`; `kernel_select`/`kernel_table` serve the MoE
    kernels (biased experts, gpt-oss's, too since session 24), `get` (dequantized, for layers the kernels cannot run:
    a type without a kernel) serves the generic path."""

    def __init__(self, model, device: torch.device | str, load: TensorLoader, act_format):
        from sparkd.engine.kernels import dispatch

        self.model, self.device = model, torch.device(device)
        self._load, self._act = load, act_format
        self._multiplies = dispatch.multiplies
        self._gate_up_layout, self._down_layout = gate_up_layout(), down_layout()  # read at load
        # the types whose experts take their nibble_tiles layout (kernels/moe.tiled_nibbles)
        self._nibble_types = [t for t, layout in ((GGMLQuantizationType.MXFP4, mxfp4_layout()),
                                                  (GGMLQuantizationType.Q4_0, q4_0_layout())) if layout == "tiled"]
        # (layer, GATE / UP / DOWN) repacked at load: the function that gives a matrix's GGUF blocks back
        self._tiled: dict[tuple[int, str], Callable[[torch.Tensor, tuple[int, int]], torch.Tensor]] = {}
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
            self._layers[il] = (parts, self._table(il, parts))
        return self._layers[il]

    def _table(self, il: int, parts: dict) -> KernelLayer | None:
        from sparkd.engine.kernels import q4_k_pair, q4_k_tiled
        from sparkd.engine.kernels.moe import (NIBBLE_TILED, ExpertTable, prepare, tiled_down, tiled_gate_up,
                                               tiled_nibbles)

        (g, gt, gs), (u, ut, _), (d, dt, _) = parts[GATE], parts[UP], parts[DOWN]
        n, width, dim = gs
        if gt != ut or not self._multiplies(gt, dim) or not self._multiplies(dt, width):
            return None
        offs = [[e * t.numel() // n for e in range(n)] for t in (g, u, d)]
        table = ExpertTable(g, u, d, *offs, gt, dt, dim, width)
        pairx = q4_k_tiled.LOADS == "pairx"
        # in place: get() unpacks what it dequantizes
        if self._gate_up_layout == "tiled" and gt == GGMLQuantizationType.Q4_K and pairx \
                and q4_k_tiled.packable((width, dim)):
            table = tiled_gate_up(table)
            self._tiled.update({(il, GATE): q4_k_pair.unpack_raw, (il, UP): q4_k_pair.unpack_raw})
        min_dim = down_min_dim(self._down_layout)
        if min_dim is not None and dim >= min_dim and dt == GGMLQuantizationType.Q4_K and pairx \
                and q4_k_tiled.packable((dim, width)):
            table = tiled_down(table)
            self._tiled[(il, DOWN)] = q4_k_pair.unpack_raw
        nibbles = [t for t in self._nibble_types if t in (gt, dt) and NIBBLE_TILED[t].FAMILY.idot is not None]
        if nibbles:  # (an expert's 4-bit rows are whole 16-row tiles: 32 | rows)
            table = tiled_nibbles(table, nibbles)
            unpack = {m.TILED: m.unpack_raw for m in NIBBLE_TILED.values()}
            self._tiled.update({(il, name): unpack[qtype] for name, qtype in
                                ((GATE, table.gate_up_type), (UP, table.gate_up_type), (DOWN, table.down_type))
                                if qtype in unpack})
        return KernelLayer(prepare(table, self.device), self._act(f"blk.{il}.{GATE}.weight"),
                           self._act(f"blk.{il}.{DOWN}.weight"), self._biases(il, n, width, dim))

    def _biases(self, il: int, n: int, width: int, dim: int) -> torch.Tensor | None:
        """The layer's expert biases as one float32 [E, 2F + D] tensor on the device (gate | up | down; a missing one
        zeros), or None where it has none."""
        names = [f"blk.{il}.{name}.bias" for name in (GATE, UP, DOWN)]
        if not any(name in self.model.tensors for name in names):
            return None
        parts = [self._load(name).float().reshape(n, -1) if name in self.model.tensors
                 else torch.zeros(n, size) for name, size in zip(names, (width, width, dim))]
        return torch.cat([t.to(self.device) for t in parts], dim=1).contiguous()

    def kernel_table(self, il: int) -> KernelLayer | None:
        """All of the layer's experts (prefill groups tokens by expert over this table)."""
        return self._layer(il)[1]

    def kernel_select(self, il: int, ids: torch.Tensor) -> KernelSelection | None:
        """The experts `ids` (int64 [A] on the device) of one token; None: not kernel-able."""
        layer = self._layer(il)[1]
        if layer is None:
            return None
        sel = layer.select(ids)
        # the kernels read a selection's bias rows through its ids; gathered offsets (ids off) want them gathered too
        bias = None if layer.bias is None else layer.bias if sel.ids is not None else layer.bias.index_select(0, ids)
        return KernelSelection(sel, layer.act_gate, layer.act_down, bias)

    def get(self, layer: int, expert_ids: Sequence[int]) -> ExpertWeights:
        parts, _ = self._layer(layer)

        def pick(name: str) -> list[torch.Tensor]:
            raw, qtype, (n, rows, cols) = parts[name]
            per = raw.numel() // n

            def blocks(e: int) -> torch.Tensor:  # the file's blocks of expert e (a tiled matrix unpacked)
                unpack = self._tiled.get((layer, name))
                own = raw[e * per:(e + 1) * per]
                return own if unpack is None else unpack(own, (rows, cols))
            return [dequantize(blocks(e), qtype, (rows, cols)) for e in expert_ids]  # not stacked: one copy less

        def bias(name: str) -> torch.Tensor | None:
            full = f"blk.{layer}.{name}.bias"
            if full not in self.model.tensors:
                return None
            return self._load(full).to(self.device)[list(expert_ids)]
        return ExpertWeights(pick(GATE), pick(UP), pick(DOWN), bias(GATE), bias(UP), bias(DOWN),
                             self._act(f"blk.{layer}.{GATE}.weight"), self._act(f"blk.{layer}.{UP}.weight"),
                             self._act(f"blk.{layer}.{DOWN}.weight"))
