"""The streamed decode step with the resident parts between MoE layers as CUDA graphs.

A streamed token cannot be one graph: each MoE layer's experts are read on the host once its
routing ids are known. But what runs between two MoE layers, the block's attention norm,
attention, residual add and FFN norm, and the router, needs nothing from the host: per layer that
part ("segment") is captured once and replayed every token (about ten launches and their Python
become one replay). Per layer the host then copies the routing ids back (the one wait, as the
eager step's kernel_select does), builds the kernel table and launches the MoE kernels eagerly.

The segment runs the same kernels with the same arguments as the eager one-token step: attention
reads every cache row (span = the context, as decode_rows gives an eager step) through the decode
kernels up to the device position, so the bits are the same (tests: eager == segments on the CPU
interpreter, eager == replay on CUDA). Where that does not hold (the eager decode kernels switched
off, another attention or block, shared experts) segment_blocker names why and the eager step runs.

$SPARKD_STREAM_GRAPHS=0 (or off) keeps the eager step (EagerDecode); unset or on: segments on CUDA.
"""

from __future__ import annotations

import torch

from sparkd.engine import switches
from sparkd.engine.errors import EngineError
from sparkd.engine.streaming.eager_step import EagerDecode

ENV = "SPARKD_STREAM_GRAPHS"


def graphs_default(env: dict | None = None) -> bool:
    return switches.flag(ENV, True, env)


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
        if ffn.router.n_groups > 1 or not hasattr(ffn.store, "kernel_select"):
            return f"layer {il}: its router or expert store has no one-token kernel step"
    return None


def streaming_step(net, cache, device: str, cuda_graphs: str = "auto", log=lambda line: None):
    """The decode step for a streamed model: SegmentDecode with graphs on CUDA where the switch is
    on, --cuda-graphs is not off and segment_blocker finds nothing (logging why not otherwise),
    else EagerDecode."""
    if not str(device).startswith("cuda") or not graphs_default() or cuda_graphs == "off":
        return EagerDecode(net, cache)
    if why := segment_blocker(net):
        log(f"streamed decode without segment graphs: {why}")
        return EagerDecode(net, cache)
    return SegmentDecode(net, cache, graphs=True)


class SegmentDecode(EagerDecode):
    """EagerDecode's interface; each layer's segment replayed from a graph captured on its first
    token (graphs=True, CUDA) or run eagerly with the same static shapes (graphs=False: tests)."""

    def __init__(self, net, cache, graphs: bool):
        super().__init__(net, cache)
        self.graphs = graphs
        self.pos = torch.zeros(1, dtype=torch.long, device=cache.device)  # the step's position
        self.x = None  # [1, D] the segments' input, one buffer (they run one after another)
        self._graphs: dict[int, tuple] = {}  # layer -> (graph, its outputs)
        self._pool = None

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
        for il, block in enumerate(net.blocks):
            self.x.copy_(x)
            residual, normed, w, ids = self.segment(il)
            x = block.ffn(normed, residual=residual, routing=(w, ids))
        cache.n_past += 1
        return net.head(x)

    def segment(self, il: int):
        """(residual, normed, weights, ids) of layer il's segment on self.x."""
        if not self.graphs:
            return self._run(il)
        if il not in self._graphs:
            self._graphs[il] = self._capture(il)
        graph, out = self._graphs[il]
        graph.replay()
        return out

    def _run(self, il: int):
        from sparkd.engine.layers.norm import add_norm

        block, cache = self.net.blocks[il], self.cache
        cache.span = cache.max_ctx  # every row, as decode_rows gives the eager step; the position on the device
        try:
            h = block.attn(block.attn_norm(self.x), self.pos, cache)
            if block.post_attn_norm is not None:
                h = block.post_attn_norm(h)
            residual, normed = add_norm(self.x, h, block.ffn_norm)
            w, ids = block.ffn.router(normed)
        finally:
            cache.span = None
        return residual, normed, w, ids

    def _capture(self, il: int):
        # a run on a side stream first, as capture wants (it writes this token's K/V rows, as
        # the replay that follows does again)
        side = torch.cuda.Stream(self.cache.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run(il)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._run(il)
        self._pool = graph.pool()
        return graph, out
