"""The streamed decode step with the resident parts between MoE layers as CUDA graphs.

A streamed token cannot be one graph: each MoE layer's experts are read on the host once its
routing ids are known. But what runs between two routers needs nothing from the host: the MoE
kernels of layer i-1 (their kernel table's offsets in a fixed device buffer per layer, copied there
by the host once the experts are at hand), then layer i's attention norm, attention, residual add,
FFN norm and router. Per layer that part ("segment") is captured once and replayed every token:
some ten launches and their Python become one replay. Per layer the host then copies the routing
ids back (the one wait, as the eager step's kernel_select does), has the experts read and copies
their offsets; the last segment holds the last layer's experts and the output head.
With --prefetch the segment also computes the prefetch hooks' guess for the next layer from the
block's input (prefetch.guess) and the host asks for it between segments (prefetch.request), before
the layer's own reads: the store sees the eager step's calls in the eager step's order.

$SPARKD_STREAM_GRAPHS: "experts" (unset) as above; "segments": the segments without the MoE
kernels (those launched eagerly per layer, through MoE.forward); "off" (or --cuda-graphs off): the
eager step (EagerDecode).

A segment runs the same kernels with the same arguments as the eager one-token step: attention
reads every cache row (span = the context, as decode_rows gives an eager step) through the decode
kernels up to the device position, so the bits are the same (tests: eager == segments on the CPU
interpreter, eager == replay on CUDA). Where that would not hold (the eager decode kernels switched
off, another attention or block, shared experts) segment_blocker names why and the eager step runs.
"""

from __future__ import annotations

import torch

from sparkd.engine import switches
from sparkd.engine.errors import EngineError
from sparkd.engine.graph_capture import capture
from sparkd.engine.streaming import prefetch
from sparkd.engine.streaming.eager_step import EagerDecode

ENV = "SPARKD_STREAM_GRAPHS"
MODES = ("experts", "segments", "off")


def graphs_mode(env: dict | None = None) -> str:
    return switches.choice(ENV, MODES, "experts", env)


def segment_blocker(net) -> str | None:
    """Why the network's segments cannot run as the eager step does (naming the layer), or None."""
    from sparkd.engine.kernels import fused
    from sparkd.engine.layers.attention import Attention
    from sparkd.engine.layers.moe import MoE
    from sparkd.engine.models.decoder import Block, Decoder

    if type(net) is not Decoder:
        return f"its decoder ({type(net).__name__}) runs its own forward"
    if not fused.one_token(False):
        return "the eager step's decode kernels are off (SPARKD_FUSED_EAGER=0): the bits would differ"
    probe = net.output_norm.weight if hasattr(net.output_norm, "weight") else next(net.parameters())
    if not (fused.active("rope_kv", probe) and fused.active("attention", probe)):
        return "the rope_kv or attention decode kernel is switched off (SPARKD_FUSED_KERNELS)"
    for il, block in enumerate(net.blocks):
        if type(block) is not Block or type(block.attn) is not Attention:
            return f"layer {il}: not the shared decoder block with GQA attention"
        ffn = block.ffn
        if not isinstance(ffn, MoE) or block.post_ffn_norm is not None or not ffn.takes_residual:
            return f"layer {il}: not a MoE layer that adds the residual itself (shared experts, a dense FFN)"
        if ffn.router.n_groups > 1 or getattr(ffn.store, "kernel_device", None) is None \
                or ffn.act_name not in ("silu", "swiglu_oai"):
            return f"layer {il}: its router or expert store has no one-token kernel step"
    return None


def experts_blocker(net) -> str | None:
    """Why the MoE kernels cannot join the segments (segment_blocker's reasons first), or None."""
    if why := segment_blocker(net):
        return why
    store = net.blocks[0].ffn.store
    if store.table_mode != "cached":
        return f"the kernel tables are made anew per call (SPARKD_STREAM_TABLE={store.table_mode})"
    return None


def decode_step(net, cache, device: str, graphs: bool, streamed: bool, cuda_graphs: str = "auto",
                log=lambda line: None, margin: int = 0):
    """The one-token decode step of `generate` and the server: the whole token as a CUDA graph
    (cuda_graphs.StaticDecode; margin: the free device memory each capture must leave) where use_graphs
    allowed it (graphs), else streaming_step for a streamed model, else the eager step."""
    if graphs:
        from sparkd.engine.cuda_graphs import StaticDecode

        return StaticDecode(net, cache, graphs=True, log=log, margin=margin)
    return streaming_step(net, cache, device, cuda_graphs, log) if streamed else EagerDecode(net, cache)


def streaming_step(net, cache, device: str, cuda_graphs: str = "auto", log=lambda line: None):
    """The decode step for a streamed model: SegmentDecode with graphs on CUDA (with the MoE
    kernels where the switch and experts_blocker allow) unless the switch or --cuda-graphs is off
    or segment_blocker finds something (logged), else EagerDecode."""
    mode = graphs_mode()
    if not str(device).startswith("cuda") or mode == "off" or cuda_graphs == "off":
        return EagerDecode(net, cache)
    if why := segment_blocker(net):
        log(f"streamed decode without segment graphs: {why}")
        return EagerDecode(net, cache)
    if mode == "experts" and (why := experts_blocker(net)):
        log(f"streamed decode graphs without the MoE kernels: {why}")
        mode = "segments"
    return SegmentDecode(net, cache, graphs=True, experts=mode == "experts")


class SegmentDecode(EagerDecode):
    """EagerDecode's interface; each segment replayed from a graph captured on its first token
    (graphs=True, CUDA) or run eagerly with the same static shapes (graphs=False: tests).
    experts: the MoE kernels in the segments (else launched by MoE.forward between them)."""

    def __init__(self, net, cache, graphs: bool, experts: bool = True):
        super().__init__(net, cache)
        self.graphs, self.experts = graphs, experts
        self.store = net.blocks[0].ffn.store  # one store for every layer
        self.prefetch = bool(self.store.plan.prefetch_slots)  # session.py attached the eager step's hooks
        self.pos = torch.zeros(1, dtype=torch.long, device=cache.device)  # the step's position
        self.x = None  # [1, D] the first segment's input (and each one's without experts)
        self._outs: dict[int, tuple] = {}  # segment -> its outputs (the next segment's inputs)
        self._offsets: dict[int, torch.Tensor] = {}  # layer -> its kernel table's offsets, on the device
        self._sel: dict[int, object] = {}  # layer -> its KernelSelection over those offsets
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self.capturing = False  # a graph capture (with its warm-up run) in progress: profile.py skips its hooks

    def __call__(self, token: int) -> torch.Tensor:
        return self.row(token)

    def row(self, token: int) -> torch.Tensor:
        """step(token): the logits [1, V] on the CPU."""
        return self._step(token).cpu()

    @torch.inference_mode()
    def next_token(self, token: int) -> int:
        from sparkd.engine.sampler import greedy_pick

        logits = self._step(token)
        return int(greedy_pick(logits[-1] if self.device_argmax else logits[-1].cpu()))

    @torch.inference_mode()
    def _step(self, token: int) -> torch.Tensor:
        """The logits [1, V] on the device of `token` at the cache's next position; n_past advanced."""
        net, cache = self.net, self.cache
        if cache.n_past >= cache.max_ctx:
            raise EngineError(f"could not extend the KV cache to {cache.n_past + 1} positions: context is "
                              f"{cache.max_ctx} (raise --ctx)")
        self.pos.fill_(cache.n_past)
        x = net.embed(torch.tensor([token]))
        if net.embd_scale != 1.0:
            x = x * net.embd_scale
        if self.x is None:
            self.x = torch.empty_like(x)
        self.x.copy_(x)
        if self.prefetch:
            self.store.begin_step()  # block 0's first pre-hook
        n = len(net.blocks)
        for il, block in enumerate(net.blocks):
            residual, normed, w, ids, guessed = self.segment(il)
            if guessed is not None:  # block il's pre-hook
                prefetch.request(self.store, net.blocks[il + 1], guessed)
            if self.experts:
                self.select(il, ids)
                continue
            y = block.ffn(normed, residual=residual, routing=(w, ids))
            if il + 1 == n:
                cache.n_past += 1
                return net.head(y)
            self.x.copy_(y)
        cache.n_past += 1
        return self.segment(n)

    def select(self, il: int, ids: torch.Tensor) -> None:
        """Layer il's experts read (or found) and their offsets in the layer's device buffer."""
        store = self.net.blocks[il].ffn.store
        if il not in self._offsets:
            self._offsets[il] = torch.empty(3 * ids.shape[-1], dtype=torch.int64, device=ids.device)
        sel = store.kernel_select(il, ids[0], self._offsets[il])
        if sel is None:
            raise EngineError(f"could not run layer {il}'s experts through the MoE kernels: the store has no "
                              f"kernel table for it (SPARKD_STREAM_GRAPHS=segments or off runs them otherwise)")
        self._sel[il] = sel

    def segment(self, k: int):
        """Segment k's outputs: (residual, normed, weights, ids) of layer k and the prefetch guess
        of layer k + 1's ids (None without prefetch or a next layer); the logits for k = the number
        of layers (experts only)."""
        if not self.graphs:
            self._outs[k] = self._run(k)
        elif k not in self._graphs:
            self._graphs[k] = self._capture(k)
            self._graphs[k].replay()
        else:
            self._graphs[k].replay()
        return self._outs[k]

    def _run(self, k: int):
        x = self.x
        if self.experts and k > 0:
            residual, normed, w = self._outs[k - 1][:3]
            moe = self.net.blocks[k - 1].ffn
            x = moe.decode_selected(self._sel[k - 1], normed, w.float().contiguous(), residual)[None]
        if k == len(self.net.blocks):
            return self.net.head(x)
        block, cache = self.net.blocks[k], self.cache
        nxt = k + 1 < len(self.net.blocks) and self.prefetch
        guessed = prefetch.guess(self.net.blocks[k + 1], x) if nxt else None
        cache.span = cache.max_ctx  # every row, as decode_rows gives the eager step; the position on the device
        try:
            residual, normed = block.attn_add_norm(x, self.pos, cache)
            w, ids = block.ffn.router(normed)
        finally:
            cache.span = None
        return residual, normed, w, ids, guessed

    def _capture(self, k: int) -> torch.cuda.CUDAGraph:
        # (the warm-up writes this token's K/V rows, as the replay that follows does again)
        self.capturing = True
        try:
            graph, self._outs[k] = capture(self.cache.device, self._pool, lambda: self._run(k), lambda: self._run(k))
        finally:
            self.capturing = False
        self._pool = graph.pool()
        return graph
