"""CUDA graphs for the resident decode step.

A decode step launches a few hundred small kernels (norms, rounding, GEMVs, rope, attention, the
MoE kernels); on a fast GPU Python and the launches, not the kernels, set the time. StaticDecode
runs the step with fixed shapes: the token id and its position sit in device buffers, and
attention reads the cache's rows up to a bucket length (256, 512, ... up to the context), masked
by position (KVCache.span). So one step captured per bucket replays for every position in it.

Capture needs every layer to stay on the device between the token and the logits: GQA attention
or MLA (glm-dsa's sparse attention too: its indexer selects by device position since session 32),
Kimi K3's KDA (its recurrent state is updated in place) and DeepSeek V4's windowed attention with its
compressors and indexer (a static step writes its block's entry each step: layers/kv_compressor.py;
both session 33), dense FFNs, and routed experts through the Triton MoE kernels (KernelExperts).
Streamed experts (read from disk per token: streaming/graph_step.py captures a graph per layer
between the reads instead) keep the eager step; graph_blocker names the layer and the reason.

Two further cuts of the step (each with a switch back, docs/engine.md): the norms that feed an
integer GEMV write x's int8 blocks themselves (link_norm_quant; SPARKD_FUSED_KERNELS's
norm_quant), and a greedy request's token is picked on the GPU inside the graph (next_token:
torch.argmax, the host sampler's own op, so ties and NaN resolve the same way) so one int comes
back instead of the logits row ($SPARKD_DEVICE_ARGMAX=0 copies the logits back as before).
A temperature request draws on the GPU too (device_sampler.DeviceSampler: two Triton launches,
or the torch chain where top_k rules the kernels out; its own small graph per bucket and chain,
captured on the first draw there (the server's engine captures every chain's at load: capture_draws,
$SPARKD_LOAD_DRAW_GRAPHS) and replayed right after the step's; the first token's draw, from
the prompt's logits row, runs the same chain eagerly: pick_from; $SPARKD_DEVICE_SAMPLING=0 to sample
on the host, =torch for the torch chain always).

Prompts replay graphs of their own (prompt_graphs.py).

Session 20 (graph45): the server captures at load every bucket's step (serve --decode-graphs auto,
StaticDecode.warm) and so every bucket's draw graphs, so a reply that crosses 256, 512, ... positions
captures nothing in its stream; the step captures share PromptForward's free-memory margin (graph_capture.Room).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from sparkd.engine import switches
from sparkd.engine.device_sampler import MODES as SAMPLING_MODES, DeviceSampler, device_drawable, \
    device_sampling_default
from sparkd.engine.errors import EngineError
from sparkd.engine.graph_capture import NoRoom, Room, capture, failure, mib, release
from sparkd.engine.layers.attention import Attention
from sparkd.engine.layers.dsv4_attention import DSV4Attention
from sparkd.engine.layers.ffn import GatedFFN
from sparkd.engine.layers.kda import KDAttention
from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.linear import KernelLinear
from sparkd.engine.layers.mla import MLAttention
from sparkd.engine.layers.moe import MoE
from sparkd.engine.layers.norm import RMSNorm
from sparkd.engine.layers.qlinear import QuantLinear, QuantRows
from sparkd.engine.models.decoder import Decoder
from sparkd.engine.sampler import Sampler, SamplingParams, greedy_pick

MODES = ("auto", "on", "off")
# The first bucket: a 256-row attention costs about what a 1-row one does on a GPU, and short
# chats then need one capture; each further bucket doubles, so a context of C needs log2(C/256)+1.
FIRST_BUCKET = 256
DEVICE_ARGMAX_ENV = "SPARKD_DEVICE_ARGMAX"
DECODE_PIPELINE_ENV = "SPARKD_DECODE_PIPELINE"
LOAD_DRAW_GRAPHS_ENV = "SPARKD_LOAD_DRAW_GRAPHS"


def device_argmax_default() -> bool:
    """$SPARKD_DEVICE_ARGMAX: "0" or "off" brings every step's logits back for the host sampler;
    "1", "on" (or unset) lets a greedy request take its token from the GPU."""
    return switches.flag(DEVICE_ARGMAX_ENV, True)


def load_draw_graphs_default() -> bool:
    """$SPARKD_LOAD_DRAW_GRAPHS: "1", "on" (or unset) has the server's engine capture at load the draw graph of
    every device-sampler path in every bucket whose step graph it captured (StaticDecode.capture_draws);
    "0" or "off" leaves each to the first request that draws there (as before session 19)."""
    return switches.flag(LOAD_DRAW_GRAPHS_ENV, True)


def decode_pipeline_default() -> bool:
    """$SPARKD_DECODE_PIPELINE: "auto" (or unset) lets a request whose picks stay on the device
    launch each step before the host reads the pick it feeds (StaticDecode.launch, where the cache
    can rewind); "off" keeps one step in flight, its pick read before the next launch."""
    return switches.choice(DECODE_PIPELINE_ENV, ("auto", "off"), "auto") == "auto"


def link_norm_quant(net: Decoder) -> int:
    """Give each RMSNorm whose output an integer GEMV reads next (the attention's first
    projection, a dense FFN's gate, a MoE's gate/up kernel, the output head) that GEMV's x
    format, so the norm writes x's int8 blocks for it (RMSNorm.quant_fmt); returns how many norms
    were linked. Other readers of the same output (the router) are unaffected: they get the same
    float tensor."""
    pairs = [(net.output_norm, net.output)] + [pair for block in net.blocks for pair in block.norm_readers()]
    linked = 0
    for norm, reader in pairs:
        if isinstance(norm, RMSNorm) and type(reader) in (KernelLinear, MoE) and (fmt := reader.x_format()):
            norm.quant_fmt, linked = fmt, linked + 1
    return linked


def buckets(max_ctx: int, first: int = FIRST_BUCKET) -> list[int]:
    """Attention spans: first, 2*first, ... and max_ctx itself as the last."""
    spans, span = [], first
    while span < max_ctx:
        spans.append(span)
        span *= 2
    return spans + [max_ctx]


def graph_blocker(net: Decoder, streaming: bool = False) -> str | None:
    """Why the network's decode step cannot be captured as a CUDA graph (naming the layer), or
    None when it can."""
    if streaming:
        return ("routed experts are streamed (the expert store reads from disk per token on the host; "
                "the streamed step replays a graph per layer instead: streaming/graph_step.py)")
    if isinstance(net.tok_embd, QuantRows):
        return "the token embedding is dequantized on the host (QuantRows)"
    for il, block in enumerate(net.blocks):
        if why := _block_blocker(block):
            return f"layer {il}: {why}"
    for name, module in net.named_modules():
        if isinstance(module, QuantLinear):
            return f"{name} is dequantized on the host per call (QuantLinear)"
    return None


def attention_blocker(attn: torch.nn.Module) -> str | None:
    """Why a block's attention has no static-shape one-token step (a graph's), or None."""
    if type(attn) not in (Attention, MLAttention, KDAttention, DSV4Attention):
        return (f"{type(attn).__name__} reads positions on the host (GQA Attention, MLA, KDA and DeepSeek V4's "
                "have a static-shape step)")
    return None


def _block_blocker(block: torch.nn.Module) -> str | None:
    if why := attention_blocker(block.attn):
        return why
    ffn = block.ffn
    if isinstance(ffn, MoE):
        table = getattr(ffn.store, "kernel_table", None)
        if ffn.kernel_act is None or table is None or table(ffn.il) is None:
            return ("its routed experts run the torch path (host lists of experts): experts with "
                    "biases, an activation or a type without a Triton MoE kernel, or experts not on the GPU")
    elif not isinstance(ffn, GatedFFN):
        return f"its FFN ({type(ffn).__name__}) has no static-shape step"
    return None


def use_graphs(mode: str, net: Decoder, device: str, streaming: bool = False,
               log: Callable[[str], None] = lambda line: None) -> bool:
    """--cuda-graphs: auto captures when the device is CUDA and every layer can be captured
    (logging the reason once when not); on refuses a model that cannot; off never captures."""
    if mode not in MODES:
        raise EngineError(f"could not use --cuda-graphs {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "off":
        return False
    why = "the device is the CPU (use --device cuda)" if not device.startswith("cuda") \
        else graph_blocker(net, streaming)
    if why is None:
        return True
    if mode == "on":
        raise EngineError(f"could not use --cuda-graphs on: {why}; use --cuda-graphs auto or off")
    if device.startswith("cuda"):
        log(f"CUDA graphs off, decoding eagerly: {why}")
    return False


class StaticDecode:
    """Decode steps with fixed shapes over one cache; with graphs=True each bucket's step is
    captured on first use and replayed (on the CPU, tests run it without graphs).

    step(token) → logits [1, V] on the CPU for `token` at the cache's next position, n_past
    advanced, like net(torch.tensor([token]), cache); next_token(token) → the argmax of those
    logits as the host's torch.argmax picks it, with only that int leaving the device
    (device_argmax; else the logits come back and the host picks), or, after begin_sampling
    accepted a temperature request, the token DeviceSampler draws from them; pick_from(row, sample, ...)
    → the first token's pick from the prompt's logits row (drawn on the device then too).

    The pipelined decode (pipeline: where the switch allows and the cache can rewind): launch(token)
    enqueues a step without waiting, launch() one fed by the last launch's pick on the device, pick()
    reads the oldest unread pick back, drop() undoes the newest launch (see launch).

    device_sampling: "fused", "chain-top-p", "capped", "torch" or "off" (True: "fused", False: "off",
    None: the switch); the fused kernels run on CUDA only (a CPU step draws with the torch chain).

    A capture that fails (out of memory, any error in its warm-up or capture) or that would leave less
    than `margin` bytes of device memory free (PromptForward's rule; 0: no check) gives its bucket up:
    logged once with the reason, its memory returned, and that bucket's steps (or draws) run the
    same static step eagerly from then on (failed): the request goes on with the same bits. A step
    captured is logged with its time and what it added to the pool (pool_bytes, the draws' too).

    warm(positions) captures the steps of those positions' buckets (all: the server's load under
    --decode-graphs auto) longest first; prepare(n) those up to n positions (generate)."""

    def __init__(self, net: Decoder, cache: KVCache, graphs: bool, first_bucket: int = FIRST_BUCKET,
                 device_argmax: bool | None = None, device_sampling: bool | str | None = None,
                 log: Callable[[str], None] = lambda line: None, pipeline: bool | None = None,
                 margin: int = 0):
        self.net, self.cache, self.graphs, self.log = net, cache, graphs, log
        # a launch ahead writes one row past the accepted tokens: a cache with recurrent state
        # (rewind_limit 0) would fold a dropped token into that state for good
        self.pipeline = (decode_pipeline_default() if pipeline is None else pipeline) and cache.rewind_limit != 0
        self.device_argmax = device_argmax_default() if device_argmax is None else device_argmax
        mode = device_sampling_default() if device_sampling is None else device_sampling
        mode = {True: "fused", False: "off"}.get(mode, mode)
        if mode not in SAMPLING_MODES:
            raise EngineError(f"could not use device sampling {mode!r}: choose one of {', '.join(SAMPLING_MODES)}")
        self.device_sampling = mode != "off"
        self.fused_sampling = mode in ("fused", "chain-top-p", "capped") and cache.device.type == "cuda"
        self.full_sampling = mode in ("fused", "chain-top-p")  # capped: top_k 0 on the torch chain (session 15)
        self.top_p_sampling = mode == "fused"  # chain-top-p: top_p < 1 with top_k 0 there (session 18)
        self.sampler: DeviceSampler | None = None  # made on the first request that draws here
        self.drawing = False                       # next_token draws (else picks the argmax)
        # (span, path) -> the draw graph of that bucket and DeviceSampler.path, captured on its first draw
        self._draws: dict[tuple[int, str], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._draw_pool = None  # one pool for every bucket's draw graph, as _pool for the steps
        self.buckets = buckets(cache.max_ctx, first_bucket)
        self.token = torch.zeros(1, dtype=torch.long, device=cache.device)  # [1] static inputs
        self.pos = torch.zeros(1, dtype=torch.long, device=cache.device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None]] = {}
        self._pool = None  # one memory pool for every bucket's graph (they never run at once)
        self.failed: dict[object, str] = {}  # span, or a draw's (span, path) -> why its capture was given up
        self.pool_bytes: dict[object, int] = {}  # span, or a draw's (span, path) -> what its capture added
        self._room = Room(cache.device, margin, "a decode graph")  # each capture's free-memory check
        # the pipelined decode: two host slots (pinned) the picks are copied to, an event after each
        # copy, the launches whose picks are unread (oldest first) and the last launch's pick on the device
        cuda = cache.device.type == "cuda"
        self._host = torch.zeros(2, dtype=torch.long, pin_memory=cuda)
        self._events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self._unread: deque[int] = deque()
        self._launched = 0
        self._last: torch.Tensor | None = None
        link_norm_quant(net)

    def __call__(self, token: int) -> torch.Tensor:
        return self._advance(token)[1].cpu()

    def begin_sampling(self, params: SamplingParams, history: Sequence[int] = (),
                       bias: torch.Tensor | None = None) -> bool:
        """Set a request up; True when next_token will draw its tokens on the device (a
        temperature request with device_sampling on; history: the tokens before the next one fed,
        bias: its logit bias [V] or None), False when next_token picks the argmax."""
        self._unread.clear()  # a request that stopped early left picks nobody reads
        self._last = None
        self.drawing = self.device_sampling and device_drawable(params)
        if self.drawing:
            self._sampler().begin(params, history, bias)
        return self.drawing

    def pick_from(self, logits: torch.Tensor, sample: Sampler, history: Sequence[int] = (),
                  bias: torch.Tensor | None = None) -> int:
        """The pick from a logits row [V] the host holds (the prompt's last), the one way generate and
        the server take it: a request that begin_sampling set to draw here has it drawn on the device
        (the row copied over; the sampler's bias and ring as begin set them, no push; the request's
        random stream, as every draw after it), else sample(logits, history, bias) on the host. The host
        draw of a 151936-logit row costs 6.4 ms (top_k 0) to 18.2 (top_p 0.95) a request (H200, session
        18); a seed's tokens now all come from the device's stream."""
        if not self.drawing:
            return sample(logits, history, bias)
        with torch.inference_mode():
            return int(self._sampler().draw(logits.reshape(-1).to(self.cache.device, torch.float32)))

    def next_token(self, token: int) -> int:
        """Step `token` and return the pick for the next position: the draw when drawing, else
        torch.argmax of the logits row (the lowest id among ties; a NaN wins, as on the host)."""
        span, logits, picked = self._advance(token)
        if self.drawing:
            return int(self._draw(span, logits))
        return int(picked if picked is not None else greedy_pick(logits[-1].cpu()))

    def launch(self, token: int | None = None) -> int:
        """Enqueue the step of `token` (None: the pick of the last launch, copied on the device, so
        the GPU runs it while the host still waits for that pick) and its pick (draw or device
        argmax: device_argmax or drawing must hold) without waiting for either; n_past advanced.

        Why it is safe: the step reads the token and position buffers in stream order, after the
        previous step and its pick's copy to a host slot (an event recorded right after the copy),
        so that copy holds the previous pick whatever the next step writes. Two slots: at most one
        pick may be unread when a step is launched. A launch the caller then finds should not have
        run (an end-of-generation pick, a cancel) is undone by drop(): the row it wrote lies past
        n_past, and whatever comes next at that position rewrites it before anything reads it.
        Returns the launch's number (for drop)."""
        if len(self._unread) > 1:
            raise EngineError("could not launch a decode step: read the pick of the one before it first")
        if token is None and self._last is None:
            raise EngineError("could not launch a decode step on the last pick: no step was launched before")
        if not (self.drawing or self.device_argmax):
            raise EngineError("could not launch a decode step: its pick is made on the host (device argmax off)")
        span, logits, picked = self._advance(self._last.view(1) if token is None else token)
        if self.drawing:
            picked = self._draw(span, logits)
        slot = self._launched % 2
        self._host[slot:slot + 1].copy_(picked.view(1), non_blocking=True)
        if self._events[slot] is not None:
            self._events[slot].record()
        self._unread.append(slot)
        self._launched += 1
        self._last = picked
        return self._launched

    def pick(self) -> int:
        """The pick of the oldest launch not read yet; waits for that step only."""
        slot = self._unread.popleft()
        if self._events[slot] is not None:
            self._events[slot].synchronize()
        return int(self._host[slot])

    def drop(self, launch: int) -> None:
        """Undo launch number `launch`, its pick unread: n_past back by one (launch() says why that is
        safe); nothing where a later launch or request came since (an iterator closed late). A draw
        there pushed its token into the sampler's ring: drop a launch only at a request's end
        (begin_sampling sets the ring for the next one)."""
        if self._unread and self._launched == launch:
            self._unread.pop()
            self.cache.n_past -= 1

    def _advance(self, token: int | torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor | None]:
        cache = self.cache
        span = self._span(cache.n_past + 1)
        if isinstance(token, torch.Tensor):
            self.token.copy_(token)
        else:
            self.token.fill_(token)
        self.pos.fill_(cache.n_past)
        out = self._replay(span) if self.graphs else self._step(span)
        cache.n_past += 1
        return span, *out

    def _sampler(self) -> DeviceSampler:
        if self.sampler is None:
            self.sampler = DeviceSampler(self.net.cfg.n_vocab, self.cache.device, fused=self.fused_sampling,
                                         full=self.full_sampling, top_p=self.top_p_sampling)
        return self.sampler

    def warm_sampling(self) -> None:
        """Make the device sampler now and run its chains once (DeviceSampler.warm): a load's work, not the
        first temperature request's, where the load captured no draw graph (a capture's warm-up runs its
        chain: capture_draws). Nothing where device sampling is off."""
        if self.device_sampling:
            self._sampler().warm()

    def prepare_draws(self, params: SamplingParams, n_positions: int) -> bool:
        """Capture the draw graphs `params`' chain takes in the buckets up to n_positions now (where
        their step graph is captured) rather than on the first draw there, as prepare does for the
        steps: generate knows its request before its timed region. It sets the request up to choose
        the chain; begin_sampling sets the real one up again, and a capture leaves the generator, the
        ring and the draw count as they were (_capture_draw), so the tokens are the same. Returns
        whether the request draws on the device (its first token too: pick_from)."""
        if not (self.graphs and self.begin_sampling(params)):
            return False
        for span in self.buckets:
            self._prepare_draw(span)
            if span >= n_positions:
                break
        return True

    def capture_draws(self) -> list[tuple[int, str, float, int]]:
        """Capture the draw graph of every path the device sampler can take (DeviceSampler.paths) in
        every bucket whose step graph is captured, rather than on a request's first draw there: the
        server's load, which knows no request (H200, session 18: the full draw's capture 2.5 ms, the
        torch chain's 54.4, a bucket). The graphs do not depend on a request's parameters (those are
        device buffers), and a capture leaves the generator and the ring as they were (_capture_draw).
        Returns (span, path, seconds, what its capture added to the pool: pool_bytes) per graph captured."""
        if not (self.graphs and self.device_sampling):
            return []
        sampler, done = self._sampler(), []
        request_path = sampler.path
        try:
            for span in sorted(self._graphs):
                for path in sampler.paths:
                    sampler.path = path  # the chain _capture_draw captures
                    t0 = time.perf_counter()
                    if self._prepare_draw(span):  # its pool growth measured by _try (Room.added)
                        done.append((span, path, time.perf_counter() - t0, self.pool_bytes[(span, path)]))
        finally:
            sampler.path = request_path
        return done

    def _prepare_draw(self, span: int) -> bool:
        """Capture the current chain's draw graph in `span` where its step graph exists and the draw's
        was neither captured nor given up; whether it was captured now."""
        key = (span, self.sampler.path)
        if span not in self._graphs or key in self._draws or key in self.failed:
            return False
        with torch.inference_mode():  # as _draw captures
            self._try(key, self._draws, lambda: self._capture_draw(self._graphs[span][1]))
        return key in self._draws

    @torch.inference_mode()
    def _draw(self, span: int, logits: torch.Tensor) -> torch.Tensor:
        """The token fed joins the sampler's ring, then the draw: eager, or the graph of this
        bucket and chain (captured here, on its first draw: a greedy-only run captures none). A
        bucket whose step runs eagerly (its capture failed) draws eagerly too: a draw graph would
        keep reading the logits tensor of the step it was captured after, not the next step's."""
        key = (span, self.sampler.path)
        if self.graphs and span in self._graphs and key not in self._draws and key not in self.failed:
            self._try(key, self._draws, lambda: self._capture_draw(logits))
        if key not in self._draws:  # no graphs, or this draw's capture failed
            return self.sampler.step(self.token, logits[-1])
        graph, picked = self._draws[key]
        graph.replay()
        return picked

    def prepare(self, n_positions: int) -> None:
        """Capture the step graphs of every bucket up to n_positions now rather than on first use
        (the draw graphs wait for a draw). Each capture writes the rows at the cache's next
        position, which the real step rewrites."""
        self._prepare([span for span in self.buckets if span < n_positions] + [self._span(min(
            max(n_positions, 1), self.cache.max_ctx))])

    def warm(self, positions: Sequence[int] | None = None) -> int:
        """Capture now the step graphs of the buckets that hold these positions and the first bucket
        (None: every bucket up to the context), the longest first, rather than on a request's first step
        there (the server's load, --decode-graphs); positions past the context are refused. Longest first,
        as PromptForward.warm: the shared pool's segments are then cut to the longest span's attention and
        the shorter spans reuse them. Returns how many step graphs are held."""
        spans = self.buckets
        if positions is not None:
            if too_long := [n for n in positions if n > self.cache.max_ctx]:
                raise EngineError(f"could not capture decode graphs for {too_long[0]} positions: the context is "
                                  f"{self.cache.max_ctx} positions (raise --ctx or list fewer in --decode-graphs)")
            spans = [self.buckets[0]] + [self._span(n) for n in positions]
        self._prepare(sorted(set(spans), reverse=True))
        return len(self._graphs)

    def _prepare(self, spans: Sequence[int]) -> None:
        self.pos.fill_(self.cache.n_past)
        for span in spans:
            if self.graphs and span not in self._graphs and span not in self.failed:
                self._try(span, self._graphs, lambda: self._capture(span))

    def stats(self) -> dict[str, int]:
        """Step graphs captured and failed (buckets), draw graphs captured and failed ((bucket, path)s),
        and pool_bytes: what their captures added to the device's reserved memory (for /metrics)."""
        draws_failed = sum(isinstance(key, tuple) for key in self.failed)
        return {"captured": len(self._graphs), "failed": len(self.failed) - draws_failed, "draws": len(self._draws),
                "draws_failed": draws_failed, "pool_bytes": sum(self.pool_bytes.values())}

    def _span(self, n: int) -> int:
        for span in self.buckets:
            if n <= span:
                return span
        raise EngineError(f"could not extend the KV cache to {n} positions: context is "
                          f"{self.cache.max_ctx} (raise --ctx)")

    @torch.inference_mode()
    def _step(self, span: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [1, V] on the device, their argmax [] there if device_argmax)."""
        self.cache.span = span
        try:
            logits = self.net.run(self.token, self.pos, self.cache)
        finally:
            self.cache.span = None
        return logits, greedy_pick(logits[-1]) if self.device_argmax else None

    def _replay(self, span: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        if span not in self._graphs and span not in self.failed:
            self._try(span, self._graphs, lambda: self._capture(span))
        if span not in self._graphs:  # its capture failed: the same step, eagerly
            return self._step(span)
        graph, *out = self._graphs[span]
        graph.replay()
        return tuple(out)

    def _try(self, key, graphs: dict, make: Callable[[], tuple]) -> None:
        """graphs[key] = make() (a step's logged with its time and pool growth), or key given up
        (failed, logged once) when make raises."""
        t0 = time.perf_counter()
        try:
            graphs[key] = make()
        except Exception as exc:  # any failure: the steps run eagerly, not the request failing
            why = str(exc) if isinstance(exc, NoRoom) else failure(exc)
        else:
            self.pool_bytes[key] = self._room.added()
            if isinstance(key, int):
                held = sum(n for k, n in self.pool_bytes.items() if isinstance(k, int))
                self.log(f"decode graph of {key} positions: captured in {1e3 * (time.perf_counter() - t0):.0f} ms, "
                         f"pool +{mib(self.pool_bytes[key], 1)} (decode graphs hold {mib(held, 1)})")
            return
        release(self.cache.device)
        self.failed[key] = why
        what = f"decode graph of {key} positions" if isinstance(key, int) else f"draw graph of {key[0]} positions"
        self.log(f"{what} not captured, run eagerly from now on: {why}")

    def _capture(self, span: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None]:
        # the warm-up makes the rope table and the expert tables; it writes this token's K/V rows (and compressor
        # ring row and entry), as the replay will
        def warm():
            with self.cache.state_kept():
                return self._room.warm(lambda: self._step(span))
        graph, out = capture(self.cache.device, self._pool, warm, lambda: self._step(span), ready=self._room.ready)
        self._pool = graph.pool()
        return graph, *out

    def _capture_draw(self, logits: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """A graph of push + draw over one bucket's logits, the chain of the current request. The
        generator is registered with it (each replay then takes the generator's seed and offset
        of that moment, so a reseed in begin_sampling holds), and its state is put back after the
        warm-up draw: when a capture happens does not change the tokens a seed gives (the fused
        warm-up neither counts its draw nor pushes)."""
        sampler = self._sampler()
        state = sampler.generator.get_state()

        def warm():  # no push: the ring stays as the request set it
            return sampler.probabilities(logits[-1]) if sampler.fusing else sampler.draw(logits[-1])
        try:
            graph, picked = capture(self.cache.device, self._draw_pool, lambda: self._room.warm(warm),
                                    lambda: sampler.step(self.token, logits[-1]), generator=sampler.generator,
                                    ready=self._room.ready)
        finally:  # also after a failed capture: the eager draw then takes the seed's own state
            sampler.generator.set_state(state)
        self._draw_pool = graph.pool()
        return graph, picked


# --decode-graphs: the decode steps' buckets captured at load ("auto": every one up to the context;
# "lazy": the first, 256, the rest on a request's first step there), or positions whose buckets are.
DECODE_GRAPH_CHOICES = ("auto", "lazy")


def parse_decode_graphs(text: str) -> str | tuple[int, ...]:
    """--decode-graphs: one of DECODE_GRAPH_CHOICES, or positions separated by commas (1 or more each,
    checked against the context at load: StaticDecode.warm) → the choice or the sorted positions."""
    value = text.strip().lower()
    if value in DECODE_GRAPH_CHOICES:
        return value
    why = f"choose one of {', '.join(DECODE_GRAPH_CHOICES)} or positions separated by commas, 1 or more each"
    try:
        positions = tuple(sorted({int(part) for part in value.split(",")}))
    except ValueError:
        raise EngineError(f"could not use --decode-graphs {text!r}: {why}") from None
    if positions[0] < 1:
        raise EngineError(f"could not use --decode-graphs {text!r}: {why}")
    return positions
