"""The one-token decode step outside a CUDA graph (streamed experts: the expert reads happen on
the host per layer, so decode stays eager), given the graph step's two host cuts:

- "norm_quant": the norms that feed an integer GEMV (attention stack, MoE gate/up, output head)
  write x's int8 blocks in their own launch (cuda_graphs.link_norm_quant; the same QuantX bits as
  the GEMV's own quantization, so the same logits);
- "device_pick": a greedy request's token is torch.argmax of the logits on the device
  (sampler.greedy_pick, the host sampler's own op: ties and NaN resolve the same way) and one int
  comes back instead of the logits row.

$SPARKD_EAGER_STEP switches them: "all" (unset), "none", or names separated by commas, read once at
import (configure() for tests).
SPARKD_FUSED_KERNELS without norm_quant turns the norm cut off for both steps.
"""

from __future__ import annotations

import torch

from sparkd.engine import switches

PARTS = ("norm_quant", "device_pick")
ENV = "SPARKD_EAGER_STEP"


def parse(spec: str) -> frozenset[str]:
    """"all", "none"/"" or names of PARTS separated by commas → the parts switched on."""
    return switches.parse_names(spec, PARTS, "the eager step's parts", ENV)


_on: frozenset[str] = switches.names(ENV, PARTS, "the eager step's parts")


def on(part: str) -> bool:
    return part in _on


def configure(spec: str) -> str:
    """Switch the parts (see parse); returns the previous choice as a spec."""
    global _on
    before = ",".join(p for p in PARTS if p in _on) or "none"
    _on = parse(spec)
    return before


class EagerDecode:
    """One-token steps of `net` over `cache` without graphs, StaticDecode's interface:
    step(token) → logits [1, V] on the CPU; next_token(token) → the greedy pick, with only that
    int leaving the device where device_pick is on (device_argmax)."""

    pipeline = False  # StaticDecode's pipelined decode (launch/pick/drop) is not offered here

    def __init__(self, net, cache):
        from sparkd.engine.cuda_graphs import device_argmax_default, link_norm_quant

        self.net, self.cache = net, cache
        # SPARKD_DEVICE_ARGMAX=0 keeps its meaning (the row comes back) for this step too
        self.device_argmax = on("device_pick") and device_argmax_default()
        self.linked = link_norm_quant(net) if on("norm_quant") else 0

    def __call__(self, token: int) -> torch.Tensor:
        return self.net(torch.tensor([token]), self.cache)

    def begin_sampling(self, params, history=(), bias=None) -> bool:
        """StaticDecode's: False, a temperature request samples its logits row on the host here
        (a streamed token waits ~60 ms on expert reads; the row's copy is not what limits it)."""
        return False

    def pick_from(self, logits: torch.Tensor, sample, history=(), bias=None) -> int:
        """StaticDecode's: the host Sampler's pick from a logits row the host holds (no request draws here)."""
        return sample(logits, history, bias)

    @torch.inference_mode()
    def next_token(self, token: int) -> int:
        """Step `token`; torch.argmax of the new position's logits (lowest id among ties, a NaN
        wins), picked where the logits are."""
        from sparkd.engine.models.decoder import positions
        from sparkd.engine.sampler import greedy_pick

        if not self.device_argmax:
            return int(greedy_pick(self(token)[-1]))
        tokens = torch.tensor([token])
        logits = self.net.run(tokens, positions(tokens, self.cache), self.cache)
        self.cache.n_past += 1
        return int(greedy_pick(logits[-1]))

