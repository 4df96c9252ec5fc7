"""Latent MoE (Kimi K3): the router scores the full-width input, the routed experts run at a
narrower latent width between a down and an up projection (with an optional RMSNorm on the
latent result), and the shared experts stay at full width on the un-projected input."""

from __future__ import annotations

import torch
from torch import nn

from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.layers.ffn import Activation
from sparkd.engine.layers.linear import Linear
from sparkd.engine.layers.moe import MoE, Router


class LatentMoE(MoE):
    def __init__(self, il: int, router: Router, store: ExpertStore, act: str | Activation,
                 down: Linear | None, up: Linear | None, latent_norm: nn.Module | None = None,
                 shared: nn.Module | None = None):
        super().__init__(il, router, store, act, shared)
        self.down, self.up, self.latent_norm = down, up, latent_norm  # [L, D], [D, L]

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                routing: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """MoE.forward's contract; the residual is added after the up projection."""
        w, ids = self.router(x, ids) if routing is None else routing  # routing reads the full width
        inner = x if self.down is None else self.down(x)  # [T, L]
        out = None
        if self.kernel_act is not None and hasattr(self.store, "kernel_select"):  # the Triton MoE kernels at L
            out = self._kernels(inner, w.float().contiguous(), ids, picked=True)
        if out is None:
            out, shared = self.routed(inner, w, ids, x)  # [T, L], [T, D]
        else:
            shared = None if self.shared is None else self.shared(x)
        return self._widen(out, shared, residual)

    def selected(self, sel, x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """MoE.selected's contract (a streamed step's segment) at the latent width."""
        inner = x if self.down is None else self.down(x)
        shared = None if self.shared is None else self.shared(x)
        return self._widen(self.decode_selected(sel, inner, w)[None], shared, residual)

    def _widen(self, out: torch.Tensor, shared: torch.Tensor | None, residual: torch.Tensor | None) -> torch.Tensor:
        """The routed sum at L [T, L] → [T, D]: its norm, the up projection, the shared experts' output and the
        residual added."""
        if self.latent_norm is not None:
            out = self.latent_norm(out)
        if self.up is not None:
            out = self.up(out)
        out = out if shared is None else out + shared
        return out if residual is None else residual + out
