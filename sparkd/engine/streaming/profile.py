"""Where decode time goes: router, routed-expert compute, waits on reads, attention and everything
else (norms, output head, prefetch guesses), from forward hooks (a perf_counter pair per call).

On a GPU the hooks' host times are launch times (kernels run asynchronously); the time the device
spends is then seen where the host waits for it, the routing ids' copy once per layer (host sync).
So a streamed model on CUDA also reports the MoE layer's host parts from the store's counters (host
sync, read wait, VRAM admission, kernel table) and GPU time spans from CUDA events: attention
(pre to post hook) and the expert kernels (kernel table ready to the MoE's post hook), plus the
VRAM cache's copies (their own events on the side stream). A span is the device timeline between
two events, so it includes gaps where the device waited for launches.

A step replaying graph segments (graph_step.SegmentDecode with graphs) runs no attention or router
forward: its segment replays (dense layers, attention norm, attention, residual add, FFN norm, router;
with experts also the previous MoE layer's kernels, and the head in the last) are timed as "attention"
then, and the router reads 0. With experts the MoE layer's host part is SegmentDecode.select
(routing ids back, reads, table), timed as "moe"; the expert kernels' GPU span is then inside the
attention one.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
from torch import nn

from sparkd.engine.layers.moe import MoE

# store counters reported as seconds of the decode (differences from when profiling started)
_STORE_SECONDS = ("host_sync_seconds", "admission_seconds", "table_seconds")


class StageProfile:
    """step (optional): the decode step object whose next_token the caller uses (EagerDecode): a
    token picked on the device runs the network without its forward, so "total" times that call."""

    def __init__(self, net: nn.Module, step=None):
        self.seconds: dict[str, float] = defaultdict(float)
        self._t0: dict[int, float] = {}
        self._handles = []
        self._step, self._depth = step, 0
        self._spans: dict[str, list] = defaultdict(list)  # stage -> [(start event, end event)]
        self._open: dict[str, object] = {}
        moes = [b.ffn for b in net.blocks if isinstance(b.ffn, MoE)]
        self._store = next((m.store for m in moes if hasattr(m.store, "on_kernel_select")), None)
        param = next(net.parameters(), None)
        self._cuda = param is not None and param.is_cuda
        for block in net.blocks:
            self._time(block.attn, "attention")
            if isinstance(block.ffn, MoE):
                self._time(block.ffn.router, "router")
                self._time(block.ffn, "moe")
        self._handles += [net.register_forward_pre_hook(lambda *_: self._total(1)),
                          net.register_forward_hook(lambda *_: self._total(-1))]
        if step is not None:
            step.next_token = self._timed(step.next_token)
        if hasattr(step, "row"):  # SegmentDecode runs the network without its forward
            step.row = self._timed(step.row)
        if getattr(step, "graphs", False):  # SegmentDecode's replays: no module forward runs
            step.segment = self._timed_stage(step.segment, "attention")
        # SegmentDecode with experts: the MoE kernels run in the segments, their host part in select
        self._moe_has_router = not getattr(step, "experts", False)
        if not self._moe_has_router:
            step.select = self._timed_stage(step.select, "moe", gpu=False)
        if self._cuda:
            for block in net.blocks:
                self._span(block.attn, "attention")
            for m in moes:
                self._handles.append(m.register_forward_hook(lambda *_: self._close("expert_kernels")))
            if self._store is not None:
                self._store.on_kernel_select = lambda: self._start("expert_kernels")
        self._base = self._store_counters()

    def _time(self, mod: nn.Module, stage: str) -> None:
        def pre(m, args):
            if not self._capturing():
                self._t0[id(m)] = time.perf_counter()

        def post(m, args, out):
            if not self._capturing():
                self.seconds[stage] += time.perf_counter() - self._t0.pop(id(m))
        self._handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]

    def _total(self, change: int) -> None:
        """The outermost of the step's call and the network's forward inside it is "total"."""
        if change > 0 and self._depth == 0:
            self._t0[id(self)] = time.perf_counter()
        self._depth += change
        if self._depth == 0:
            self.seconds["total"] += time.perf_counter() - self._t0.pop(id(self))

    def _timed(self, fn):
        def call(*args, **kwargs):
            self._total(1)
            try:
                return fn(*args, **kwargs)
            finally:
                self._total(-1)
        return call

    def _timed_stage(self, fn, stage: str, gpu: bool = True):
        def call(*args, **kwargs):
            if gpu and self._cuda:
                self._start(stage)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - t0
                if gpu and self._cuda:
                    self._close(stage)
        return call

    def _span(self, mod: nn.Module, stage: str) -> None:
        self._handles += [mod.register_forward_pre_hook(lambda *_: self._start(stage)),
                          mod.register_forward_hook(lambda *_: self._close(stage))]

    def _capturing(self) -> bool:
        """Whether the step is capturing a graph (SegmentDecode): its modules' forwards then record
        work, not run it; the capture's host time counts in the stage around it."""
        return getattr(self._step, "capturing", False)

    def _start(self, stage: str) -> None:
        if self._capturing():
            return
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self._open[stage] = ev

    def _close(self, stage: str) -> None:
        if self._capturing():
            return
        start = self._open.pop(stage, None)
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._spans[stage].append((start, end))

    def _store_counters(self) -> dict[str, float]:
        if self._store is None:
            return {}
        d = {k: getattr(self._store.stats, k) for k in _STORE_SECONDS}
        vram = getattr(self._store, "vram", None)
        if vram is not None:
            d["vram_copy_gpu_seconds"] = vram.stats.copy_seconds
        return d

    def gpu_seconds(self) -> dict[str, float]:
        """Summed CUDA event spans per stage (waits for the device once)."""
        if not self._spans:
            return {}
        torch.cuda.synchronize()
        return {f"{stage}_gpu_seconds": sum(a.elapsed_time(b) for a, b in spans) / 1e3
                for stage, spans in self._spans.items()}

    def report(self, wait_seconds: float) -> dict[str, float]:
        s = self.seconds
        experts = s["moe"] - s["router"] if self._moe_has_router else s["moe"]  # MoE.forward runs its router
        out = {"router_seconds": s["router"], "expert_compute_seconds": max(0.0, experts - wait_seconds),
               "read_wait_seconds": wait_seconds, "attention_seconds": s["attention"],
               "other_seconds": max(0.0, s["total"] - s["moe"] - s["attention"]), "total_seconds": s["total"]}
        if self._store is not None and self._store.kernel_device is not None:  # the kernel path's parts
            if self._store.vram is not None:
                self._store.vram.finish_copies()  # copies still in flight: count their time too
            now = self._store_counters()
            out.update({k: now[k] - self._base.get(k, 0.0) for k in now})
        out.update(self.gpu_seconds())
        return out

    def reset(self) -> None:
        self.seconds.clear()
        self._spans.clear()
        self._base = self._store_counters()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        if self._step is not None:
            del self._step.next_token  # back to the class's method
            vars(self._step).pop("segment", None)
            for name in ("row", "select"):
                vars(self._step).pop(name, None)
        if self._store is not None:
            self._store.on_kernel_select = None
