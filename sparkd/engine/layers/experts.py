"""Where routed-expert weights come from: the ExpertStore interface and its resident version.

The MoE block asks `store.get(layer, expert_ids)` for the experts a batch selected and never
touches model tensors itself, so a streaming store (O_DIRECT reads into a cache arena) or one that
hands back quantized blocks for a GPU kernel replaces ResidentExperts without changing the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

# tensor names of one layer's stacked experts, and their optional biases
GATE, UP, DOWN = "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"


@dataclass
class ExpertWeights:
    """Weights of the selected experts in the order of the requested ids, each field indexed by position (a
    stacked tensor, or a sequence of one tensor an expert: views of the resident ones, a streaming batch's reads).

    A experts, F expert width, D model width: gate/up [A, F, D], down [A, D, F];
    biases (gpt-oss) gate_b/up_b [A, F], down_b [A, D].
    """

    gate: Sequence[torch.Tensor]
    up: Sequence[torch.Tensor]
    down: Sequence[torch.Tensor]
    gate_b: Sequence[torch.Tensor] | None = None
    up_b: Sequence[torch.Tensor] | None = None
    down_b: Sequence[torch.Tensor] | None = None
    # how llama.cpp rounds the activations each projection multiplies (see act_round)
    act_gate: str | None = None
    act_up: str | None = None
    act_down: str | None = None
    # the order to compute experts in (e.g. cached ones while the others' reads land); the MoE
    # block still sums their outputs in id order, so the result does not depend on it
    order: Sequence[int] | None = None


class ExpertStore(Protocol):
    def get(self, layer: int, expert_ids: Sequence[int]) -> ExpertWeights: ...


TensorLoader = Callable[[str], torch.Tensor]
ActFormat = Callable[[str], "str | None"]


class ResidentExperts:
    """Every routed expert dequantized in memory, loaded one layer at a time on first use."""

    def __init__(self, load: TensorLoader, has: Callable[[str], bool],
                 act_format: ActFormat | None = None):
        self._load, self._has = load, has
        self._act = act_format or (lambda name: None)
        self._layers: dict[int, ExpertWeights] = {}

    def _layer(self, il: int) -> ExpertWeights:
        if il not in self._layers:
            def opt(name: str) -> torch.Tensor | None:
                full = f"blk.{il}.{name}.bias"
                return self._load(full) if self._has(full) else None
            self._layers[il] = ExpertWeights(
                gate=self._load(f"blk.{il}.{GATE}.weight"), up=self._load(f"blk.{il}.{UP}.weight"),
                down=self._load(f"blk.{il}.{DOWN}.weight"),
                gate_b=opt(GATE), up_b=opt(UP), down_b=opt(DOWN),
                act_gate=self._act(f"blk.{il}.{GATE}.weight"), act_up=self._act(f"blk.{il}.{UP}.weight"),
                act_down=self._act(f"blk.{il}.{DOWN}.weight"))
        return self._layers[il]

    def get(self, layer: int, expert_ids: Sequence[int]) -> ExpertWeights:
        w = self._layer(layer)
        ids = [int(e) for e in expert_ids]

        def pick(t: torch.Tensor | None) -> list[torch.Tensor] | None:  # views: a stacked copy cost a decode step
            return None if t is None else [t[e] for e in ids]  # its weights' bytes again (session 39)
        return ExpertWeights(pick(w.gate), pick(w.up), pick(w.down),
                             pick(w.gate_b), pick(w.up_b), pick(w.down_b),
                             w.act_gate, w.act_up, w.act_down)
