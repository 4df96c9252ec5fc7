"""Dense gated feed-forward blocks and the activations llama.cpp uses for them."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from sparkd.engine.layers.linear import Linear

# gpt-oss's clamped swiglu (ggml_swiglu_oai): constants fixed in llama.cpp's graph builder
OAI_ALPHA = 1.702
OAI_LIMIT = 7.0


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    x = gate.clamp(max=OAI_LIMIT)
    y = up.clamp(-OAI_LIMIT, OAI_LIMIT)
    return x * torch.sigmoid(OAI_ALPHA * x) * (y + 1.0)


# ggml's CPU gelu reads a table indexed by the f16 bits of x (outside ±10 it is 0 or x), so
# both the input and the result are rounded to f16; without that, gemma's logits move by ~1e-3.
GELU_TABLE_LIMIT = 10.0


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g = F.gelu(gate.half().float(), approximate="tanh").half().to(gate.dtype)
    g = torch.where(gate >= GELU_TABLE_LIMIT, gate, g)
    g = torch.where(gate <= -GELU_TABLE_LIMIT, torch.zeros_like(g), g)
    return g * up


def swiglu_limited(limit: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """DeepSeek V4's ggml_swiglu_clamp: silu(min(gate, limit)) * clamp(up, ±limit)."""
    def act(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)
    act.kernel = ("swiglu_clamp", float(limit), 0.0)
    return act


Activation = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (gate, up) → hidden
ACTIVATIONS: dict[str, Activation] = {"silu": swiglu, "swiglu_oai": swiglu_oai, "gelu": geglu}

# The activations the Triton MoE kernels fuse (kernels/moe.py _activate), by name; an activation with constants
# (swiglu_limited's, situ's) carries them as its `kernel` attribute: (name, a, b).
KERNEL_ACTS = ("silu", "swiglu_oai", "swiglu_clamp", "situ")
KernelAct = tuple[str, float, float]


def kernel_act(act: str | Activation) -> KernelAct | None:
    """act as the MoE kernels take it, (name, a, b), or None where they do not fuse it (the torch path runs)."""
    if isinstance(act, str):
        return (act, 0.0, 0.0) if act in KERNEL_ACTS else None
    return getattr(act, "kernel", None)


class GatedFFN(nn.Module):
    def __init__(self, gate: Linear, up: Linear, down: Linear, act: str | Activation = "silu"):
        super().__init__()
        self.gate, self.up, self.down = gate, up, down
        self.act = ACTIVATIONS[act] if isinstance(act, str) else act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate(x), self.up(x)))
