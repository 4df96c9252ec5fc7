"""Where decode time goes: router, routed-expert compute, waits on reads, attention and everything
else (norms, output head, prefetch guesses), from forward hooks (a perf_counter pair per call)."""

from __future__ import annotations

import time
from collections import defaultdict

from torch import nn

from sparkd.engine.layers.moe import MoE


class StageProfile:
    def __init__(self, net: nn.Module):
        self.seconds: dict[str, float] = defaultdict(float)
        self._t0: dict[int, float] = {}
        self._handles = []
        for block in net.blocks:
            self._time(block.attn, "attention")
            if isinstance(block.ffn, MoE):
                self._time(block.ffn.router, "router")
                self._time(block.ffn, "moe")
        self._time(net, "total")

    def _time(self, mod: nn.Module, stage: str) -> None:
        def pre(m, args):
            self._t0[id(m)] = time.perf_counter()

        def post(m, args, out):
            self.seconds[stage] += time.perf_counter() - self._t0.pop(id(m))
        self._handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]

    def report(self, wait_seconds: float) -> dict[str, float]:
        s = self.seconds
        experts = s["moe"] - s["router"]  # the MoE module's time includes its router
        return {"router_seconds": s["router"], "expert_compute_seconds": max(0.0, experts - wait_seconds),
                "read_wait_seconds": wait_seconds, "attention_seconds": s["attention"],
                "other_seconds": max(0.0, s["total"] - s["moe"] - s["attention"]), "total_seconds": s["total"]}

    def reset(self) -> None:
        self.seconds.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
