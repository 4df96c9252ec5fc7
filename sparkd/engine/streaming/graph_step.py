"""The streamed decode step with the resident parts between MoE layers as CUDA graphs.

A streamed token cannot be one graph: each MoE layer's experts are read on the host once its
routing ids are known. But what runs between two routers needs nothing from the host: the MoE
kernels of the previous MoE layer (their kernel table's offsets in a fixed device buffer per layer,
copied there by the host once the experts are at hand; the shared experts beside them), the dense
layers in between (DeepSeek's and GLM's first layers), then the next MoE layer's attention norm,
attention (GQA, MLA, Kimi K3's KDA, DeepSeek V4's), residual add, FFN norm and router. What the
segments hand on is the block's stream (models/decoder.py): the residual, with Kimi K3's AttnRes
checkpoints or as DeepSeek V4's hyper-connection copies; each segment's outputs stay where its
capture put them, so the next one reads them there. That part ("segment") is captured once
and replayed every token: tens of launches and their Python become one replay. Per MoE layer the
host then copies the routing ids back (the one wait, as the eager step's kernel_select does), has
the experts read and copies their offsets; the last segment holds the last layer's experts and the
output head.
With --prefetch the segment also computes the prefetch hooks' guesses (each block's guess of the
next MoE layer's ids from the block's input: prefetch.guess) and the host asks for them between
segments (prefetch.request), before the layer's own reads: the store sees the eager step's calls in
the eager step's order.

$SPARKD_STREAM_GRAPHS: "experts" (unset) as above; "segments": the segments without the MoE
kernels (those launched eagerly per layer, through MoE.forward); "off" (or --cuda-graphs off): the
eager step (EagerDecode).

A segment runs the same kernels with the same arguments as the eager one-token step: attention
reads every cache row (span = the context, as decode_rows gives an eager step) through the decode
kernels up to the device position, so the bits are the same (tests: eager == segments on the CPU
interpreter, eager == replay on CUDA; glm-dsa's sparse attention, torch's attend over the span's keys,
within float32 rounding; DeepSeek V4's static step, its window's rows and the compressed entries of the
span, the same). Where that would not hold (the eager decode kernels switched off, another
attention) segment_blocker names why and the eager step runs. A capture's warm-up puts the recurrent
state (Kimi K3's KDA) back, as the replay folds the token in again (KVCache.state_kept).
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
    from sparkd.engine.cuda_graphs import attention_blocker
    from sparkd.engine.kernels import fused
    from sparkd.engine.layers.ffn import GatedFFN
    from sparkd.engine.layers.moe import MoE

    if not fused.one_token(False):
        return "the eager step's decode kernels are off (SPARKD_FUSED_EAGER=0): the bits would differ"
    probe = net.output_norm.weight if hasattr(net.output_norm, "weight") else next(net.parameters())
    if not (fused.active("rope_kv", probe) and fused.active("attention", probe)):
        return "the rope_kv or attention decode kernel is switched off (SPARKD_FUSED_KERNELS)"
    for il, block in enumerate(net.blocks):
        if why := attention_blocker(block.attn):
            return f"layer {il}: {why}"
        ffn = block.ffn
        if isinstance(ffn, MoE):
            if getattr(ffn.store, "kernel_device", None) is None or ffn.kernel_act is None:
                return f"layer {il}: its expert store or activation has no one-token kernel step"
        elif not isinstance(ffn, GatedFFN):
            return f"layer {il}: its FFN ({type(ffn).__name__}) has no static-shape step"
    if not _moe_layers(net):
        return "no layer has routed experts: nothing streams"
    return None


def experts_blocker(net) -> str | None:
    """Why the MoE kernels cannot join the segments (segment_blocker's reasons first), or None."""
    if why := segment_blocker(net):
        return why
    store = _store(net)
    if store.table_mode != "cached":
        return f"the kernel tables are made anew per call (SPARKD_STREAM_TABLE={store.table_mode})"
    return None


def _moe_layers(net) -> list[int]:
    from sparkd.engine.layers.moe import MoE

    return [il for il, block in enumerate(net.blocks) if isinstance(block.ffn, MoE)]


def _store(net):
    """The streamed expert store (one for every MoE layer)."""
    return net.blocks[_moe_layers(net)[0]].ffn.store


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
    experts: the MoE kernels in the segments (else launched by MoE.forward between them).

    Segment j ends at the router of the j-th MoE layer (cuts[j]), where the host must read the routing
    ids; it holds the previous MoE layer's experts (with experts), the dense layers between the two
    (DeepSeek's and GLM's first layers) and the cut layer's attention. The last segment holds the
    last MoE layer's experts, any dense layers after it and the output head."""

    def __init__(self, net, cache, graphs: bool, experts: bool = True):
        super().__init__(net, cache)
        self.graphs, self.experts = graphs, experts
        self.cuts = _moe_layers(net)
        self.store = _store(net)
        self.prefetch = bool(self.store.plan.prefetch_slots)  # session.py attached the eager step's hooks
        self.pos = torch.zeros(1, dtype=torch.long, device=cache.device)  # the step's position
        self._ins: dict[int, object] = {}  # segment -> its input stream (the first's; each one's without experts)
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
        self._static_in(0, net.enter(torch.tensor([token])))
        if self.prefetch:
            self.store.begin_step()  # block 0's first pre-hook
        for j, il in enumerate(self.cuts):
            mid, normed, w, ids, guesses = self.segment(j)
            for target, guessed in guesses:  # the pre-hooks of the segment's blocks, in order
                prefetch.request(self.store, net.blocks[target], guessed)
            if self.experts:
                self.select(il, ids)
                continue
            moe = net.blocks[il].ffn
            self._static_in(j + 1, net.blocks[il].add_ffn(
                mid, normed, lambda h, residual=None: moe(h, residual=residual, routing=(w, ids))))
        logits = self.segment(len(self.cuts))
        cache.n_past += 1
        return logits

    def _static_in(self, j: int, stream) -> None:
        """Segment j's input: stream's tensors copied into the segment's own (made on the first token), those an
        earlier segment gave (its outputs: the same tensors every replay) read where they are."""
        if j not in self._ins:
            held = {id(t) for t in _leaves(self._outs[j - 1][0])} if j else set()  # the mid add_ffn read
            self._ins[j] = _map(stream, lambda t: t if id(t) in held else t.clone())
        for static, t in zip(_leaves(self._ins[j]), _leaves(stream), strict=True):
            if static is not t:
                static.copy_(t)

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

    def segment(self, j: int):
        """Segment j's outputs: (residual, normed, weights, ids) of layer cuts[j] and the prefetch guesses
        [(layer, ids)] its blocks' pre-hooks make; the logits for j = len(cuts)."""
        if not self.graphs:
            self._outs[j] = self._run(j)
        elif j not in self._graphs:
            self._graphs[j] = self._capture(j)
            self._graphs[j].replay()
        else:
            self._graphs[j].replay()
        return self._outs[j]

    def _run(self, j: int):
        net, cache = self.net, self.cache
        if self.experts and j > 0:
            il = self.cuts[j - 1]
            mid, normed, w = self._outs[j - 1][:3]
            moe, sel, w = net.blocks[il].ffn, self._sel[il], w.float().contiguous()
            stream = net.blocks[il].add_ffn(mid, normed, lambda h, residual=None: moe.selected(sel, h, w, residual))
        else:
            stream = self._ins[j]
        first = self.cuts[j - 1] + 1 if j > 0 else 0
        last = self.cuts[j] if j < len(self.cuts) else len(net.blocks)
        guesses = []
        cache.span = cache.max_ctx  # every row, as decode_rows gives the eager step; the position on the device
        try:
            for il in range(first, last):  # dense layers
                guesses += self._guess(il, stream)
                stream = net.blocks[il].forward(stream, self.pos, cache)  # (not its pre-hook: asked for later)
            if last == len(net.blocks):
                return net.head(net.leave(stream))
            guesses += self._guess(last, stream)
            block = net.blocks[last]
            mid, normed = block.attn_add_norm(stream, self.pos, cache)
            w, ids = block.route(mid, normed)
        finally:
            cache.span = None
        return mid, normed, w, ids, guesses

    def _guess(self, il: int, stream) -> list[tuple[int, torch.Tensor]]:
        """Block il's prefetch pre-hook: the next MoE layer's routing ids guessed from the block's input."""
        target = next((c for c in self.cuts if c > il), None)
        if not self.prefetch or target is None:
            return []
        return [(target, prefetch.guess(self.net.blocks[target], self.net.blocks[il].residual(stream)))]

    def _capture(self, j: int) -> torch.cuda.CUDAGraph:
        # (the warm-up writes this token's K/V rows, as the replay that follows does again)
        self.capturing = True

        def warm():
            with self.cache.state_kept():
                self._run(j)
        try:
            graph, self._outs[j] = capture(self.cache.device, self._pool, warm, lambda: self._run(j))
        finally:
            self.capturing = False
        self._pool = graph.pool()
        return graph


def _leaves(stream):
    """The tensors of a stream (a tensor, or tuples of them and of tuples: models/decoder.py), in order."""
    if isinstance(stream, torch.Tensor):
        yield stream
    else:
        for part in stream:
            yield from _leaves(part)


def _map(stream, fn):
    """The stream with fn applied to each of its tensors."""
    return fn(stream) if isinstance(stream, torch.Tensor) else tuple(_map(part, fn) for part in stream)
