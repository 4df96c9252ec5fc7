"""SiTU, Kimi K3's gated activation (replaces SwiGLU in its dense, shared and routed FFNs).

situ(gate, up) = beta·tanh(gate/beta)·sigmoid(gate) · lb·tanh(up/lb): a soft-capped SiLU on the
gate branch and, when linear_beta lb > 0, a soft cap on the up branch too (lb <= 0 leaves up as is).
"""

from __future__ import annotations

import torch

from sparkd.engine.layers.ffn import Activation


def _soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.tanh(x * (1.0 / cap)) * cap


def situ(beta: float, linear_beta: float) -> Activation:
    """The (gate, up) → hidden function for these constants (GatedFFN and MoE take it as act)."""
    if beta <= 0.0:
        raise ValueError(f"could not build the SiTU activation: situ_beta must be positive, got {beta}")

    def act(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        g = _soft_cap(gate, beta) * torch.sigmoid(gate)
        return g * (_soft_cap(up, linear_beta) if linear_beta > 0.0 else up)
    act.kernel = ("situ", float(beta), float(linear_beta))  # fused by the MoE kernels (ffn.kernel_act)
    return act
