"""CUDA graphs for the prompt's forward (PromptForward).

A prompt from an empty cache replays a graph (session 11): the forward of the prompt padded to its
length bucket, the last real token's logits read through a device index ($SPARKD_PREFILL_GRAPHS=0
runs prompts eagerly). Session 12: a bucket whose capture fails or would leave less free device
memory than a margin runs eagerly from then on (logged once), and the server captures the buckets
at load (serve --prompt-graphs, PromptForward.warm). Session 13 (graphs13): a prompt that continues
the cache (n_past > 0: a chat's next turn, prompt_store.PromptCache) replays a "continued" graph of
its length bucket and an attention span, its positions on the device as the decode step's
(cuda_graphs.StaticDecode; $SPARKD_CONTINUE_GRAPHS=0 runs those eagerly).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from sparkd.engine import switches
from sparkd.engine.cuda_graphs import FIRST_BUCKET, buckets
from sparkd.engine.errors import EngineError
from sparkd.engine.graph_capture import NoRoom, Room, capture, failure, mib, release
from sparkd.engine.layers import attention as attention_layer
from sparkd.engine.layers.attention import Attention
from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.moe import MoE
from sparkd.engine.models.decoder import Decoder

PREFILL_GRAPHS_ENV = "SPARKD_PREFILL_GRAPHS"
# A bucket of this many rows or more whose MoE layers take the slab experts (MoE.slab_experts) runs eagerly: a graph
# keeps the grouped integer GEMMs (the slabs' scratch, 1.2-1.6 GB, would stay in its pool: 2850-4078 MiB in all when
# captured), and the eager slabs beat them there. Session 47, H100 (prefill_bench.py, calls 4-5), eager / replayed:
# 12 layers of Qwen3-30B-A3B at 2048 tokens 47.5k / 36.1k tok/s, 4 of gpt-oss-20b at 1024 60.3k / 46.9k and at 2048
# 85.2k / 49.8k, the 5-layer DeepSeek-V3-shaped model at 1024 22-30k / 19.7k; below, the launches a graph saves
# weigh more (that model at 512 tokens: eager 10-20k, replayed 18.5k)
SLAB_EAGER_ROWS = 1024
# A prompt is padded to its bucket: PROMPT_FIRST tokens, then four buckets a doubling (at most 25%
# padding; multiples of 16, so Triton compiles one variant for all), up to prompt_last(); longer
# prompts run eagerly: the graphs' memory pool keeps the largest bucket's activations for the model's
# life. PROMPT_LAST under SPARKD_PREFILL_ATTENTION=sdpa (no scores in memory; H200, 12-layer Q4_K: the
# 2048 bucket alone 574 MiB, all 21 buckets at load 592 MiB in 1.2 s against 17's 430 MiB in 0.9 s
# under torch; a 2000-token prompt 70.7 ms replayed against 94.6 eager under torch; prefill29/prefill30);
# PROMPT_LAST_SCORES under torch and kernel: attend's [H, T, T] scores made the 2048 bucket add 1088 MiB for
# 1.01x (session 11). Sinks (gpt-oss) run SDPA too since session 41 (attention.with_sink_key); session 42 measured
# their 2048 bucket (docs/performance.md) and lifted the 1024 they had kept.
PROMPT_FIRST, PROMPT_LAST, PROMPT_LAST_SCORES = 64, 2048, 1024
PROMPT_MODES = ("graphs", "padded", "eager")
# A bucket is captured only when the device keeps this much free after it (its warm-up's peak taken
# as what the capture adds): room for what runs eagerly beside the graphs (a 2048-token prompt's
# activations, ~1.1 GiB on qwen3-30b-a3b), so graphs are never what runs the device out of memory.
PROMPT_MARGIN = 1 << 30
# --prompt-graphs: the buckets captured at load ("auto": all of them up to prompt_last() and the
# context, as they share one pool that the largest sizes; "lazy": none, each on its first prompt;
# "off": prompts eager), or a list of prompt lengths whose buckets are captured at load.
PROMPT_GRAPH_CHOICES = ("auto", "lazy", "off")
CONTINUE_GRAPHS_ENV = "SPARKD_CONTINUE_GRAPHS"
# Where the whole prompt replays a graph too, continue the cache only where it holds at least
# CONTINUE_MIN_SHARE of the prompt ($SPARKD_CONTINUE_RULE "share"; "always": wherever a continued graph
# replays, session 15): a continued graph's attention reads its whole span for every new row, where the
# whole prompt's causal kernel skips the keys past the diagonal, so a small cached share saves less than
# the masked span costs. H200, 12-layer Q4_K, turn 2's first token, continued graph / whole prompt, one
# engine interleaved (session 16's final call, docs/runs/2026-12-02-s16-final): 74.8 / 73.0 ms at 256 of
# 2048 cached (12.5 %), 74.0 / 72.7 at 384 (19 %), 64.7 / 72.1 at 512 (25 %), 49.1 / 72.7 at 1024; attn28's
# call: 31.4 / 36.7 at 256 of 1024. So the graph crosses over near 1/5.
CONTINUE_RULE_ENV = "SPARKD_CONTINUE_RULE"
CONTINUE_RULES = ("share", "always")
CONTINUE_MIN_SHARE = 1 / 5


def prefill_graphs_default() -> bool:
    """$SPARKD_PREFILL_GRAPHS: "0" or "off" runs every prompt eagerly; "1", "on" (or unset) replays a
    CUDA graph of the padded prompt where the decode step is graph-captured (PromptForward)."""
    return switches.flag(PREFILL_GRAPHS_ENV, True)


def continue_graphs_default() -> bool:
    """$SPARKD_CONTINUE_GRAPHS: "0" or "off" runs a prompt that continues the cache eagerly (and the
    engine then runs a prompt whole where only that replays a graph, as prefix13 did); "1", "on" (or
    unset) replays a continued graph (PromptForward)."""
    return switches.flag(CONTINUE_GRAPHS_ENV, True)


def continue_rule_default() -> str:
    """$SPARKD_CONTINUE_RULE: "share" (or unset) continues the cache only where it holds CONTINUE_MIN_SHARE of
    the prompt or the whole prompt replays no graph; "always" wherever a continued graph replays (session 15)."""
    return switches.choice(CONTINUE_RULE_ENV, CONTINUE_RULES, "share")


def prompt_last() -> int:
    """The longest prompt a prompt graph serves under the prompt attention now ($SPARKD_PREFILL_ATTENTION):
    PROMPT_LAST under sdpa, else PROMPT_LAST_SCORES."""
    return PROMPT_LAST if attention_layer.PREFILL_ATTENTION == "sdpa" else PROMPT_LAST_SCORES


def prompt_bucket(n: int, first: int = PROMPT_FIRST) -> int:
    """The length an n-token prompt is padded to: first up to first tokens, else n rounded up to a
    multiple of a quarter of the power of two below n (at least 16)."""
    if n <= first:
        return first
    step = max(16, 1 << (n - 1).bit_length() - 3)
    return -(-n // step) * step


def prompt_buckets(largest: int | None = None, first: int = PROMPT_FIRST) -> list[int]:
    """Every bucket prompt_bucket gives for prompts of 1..largest (None: prompt_last()) tokens, ascending."""
    largest = prompt_last() if largest is None else largest
    spans = [prompt_bucket(1, first)]
    while spans[-1] < largest:
        spans.append(prompt_bucket(spans[-1] + 1, first))
    return spans


def parse_prompt_graphs(text: str) -> str | tuple[int, ...]:
    """--prompt-graphs: one of PROMPT_GRAPH_CHOICES, or prompt lengths separated by commas (2 to
    prompt_last() tokens each) → the choice or the sorted lengths."""
    value = text.strip().lower()
    if value in PROMPT_GRAPH_CHOICES:
        return value
    last = prompt_last()
    why = f"choose one of {', '.join(PROMPT_GRAPH_CHOICES)} or prompt lengths separated by commas, 2 to {last}"
    try:
        lengths = tuple(sorted({int(part) for part in value.split(",")}))
    except ValueError:
        raise EngineError(f"could not use --prompt-graphs {text!r}: {why}") from None
    if not 2 <= lengths[0] <= lengths[-1] <= last:
        raise EngineError(f"could not use --prompt-graphs {text!r}: {why} (longer prompts run eagerly)")
    return lengths


class PromptForward:
    """The prompt's forward of `generate` and the server: tokens [T] (on the host) → logits on the
    CPU, as net(tokens, cache, last=last) gives them, n_past advanced by T.

    mode "graphs": a prompt of 2..largest (None: prompt_last()) tokens, last token's logits only,
    runs as a CUDA graph of its length bucket (prompt_bucket; captured on the bucket's first use or by
    warm, then replayed): the tokens padded at the end (token 0), the head reading the last real token's
    row (a device index). Causal attention keeps the real rows from reading the padding's keys, and the
    padding's K/V rows past the prompt are rewritten by the tokens that follow before anything reads
    them. From an empty cache the graph's key is the bucket; a prompt that continues the cache at
    n_past > 0 (continued, $SPARKD_CONTINUE_GRAPHS) replays the key (bucket, span): its positions
    n_past.. in a device input, as the decode step's (the cache's static mode: rope angles picked
    from the table, K/V rows written by index), attending over the cache's rows [0, span), span the
    first of the decode step's buckets (first_span, doubling, the context last) that holds the
    prompt, keys past a query's position masked. Eager instead: the padding would cross the context,
    bucket x span over largest^2 where the bucket runs attend_sdpa (attention.continue_sdpa: no scores
    in memory), else over min(largest, PROMPT_LAST_SCORES)^2 (attend's scores over bucket x span in the
    pool: the rule keeps them within the 1024 bucket's under torch), and
    $SPARKD_PREFILL_ATTENTION=kernel (its kernel takes a host start). Other prompts (one token, every
    token's logits, longer ones) run eagerly.
    "padded": the same padded forwards run eagerly (the CPU tests check what a graph replays);
    "eager": the network itself.

    A capture that fails (out of memory, any error in its warm-up or capture) or that would leave
    less than `margin` bytes of device memory free gives its key up: logged once with the reason,
    the partial graph dropped and its memory returned, and that prompt and every later one of the
    key run eagerly (failed). The eager forward rewrites every K/V row it reads, so the try leaves
    nothing behind in its bits (a continued capture's warm-up runs the prompt itself: it writes the
    rows the replay writes, from n_past on). pool_bytes: what each captured key added to the
    device's reserved memory (the graphs share one pool: a key at or below the largest adds ~0).

    Bits: a replay gives the padded forward's; those are the eager prompt's where the prompt fills
    its bucket (and a continued one ends at its span), else they may differ in the last bits (the
    float GEMMs, torch's, run at the bucket's row count, where cuBLAS may pick another kernel; the
    softmax and its product with V over span keys, not n_past + T; the Triton kernels are row-wise)."""

    def __init__(self, net: Decoder, cache: KVCache, mode: str = "graphs", first: int = PROMPT_FIRST,
                 largest: int | None = None, margin: int = PROMPT_MARGIN,
                 log: Callable[[str], None] = lambda line: None, continued: bool = True,
                 first_span: int = FIRST_BUCKET, rule: str = "share"):
        if mode not in PROMPT_MODES:
            raise EngineError(f"could not run prompts in mode {mode!r}: choose one of {', '.join(PROMPT_MODES)}")
        self._room = Room(cache.device, margin, "a prompt graph")  # each capture's free-memory check
        if rule not in CONTINUE_RULES:
            raise EngineError(f"could not continue prompts by rule {rule!r}: choose one of {', '.join(CONTINUE_RULES)}")
        self.net, self.cache, self.mode, self.first, self.rule = net, cache, mode, first, rule
        self.largest = prompt_last() if largest is None else largest
        self.log, self.continued = log, continued
        self.spans = buckets(cache.max_ctx, first_span)  # a continued graph's attention spans
        # key -> (graph, its input: the padded tokens [, their positions], then the last real row; logits [1, V]);
        # key: the bucket (from an empty cache) or (bucket, span) (continued)
        self._graphs: dict[int | tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._pool = None  # one memory pool for every graph (they never run at once)
        self.failed: dict[int | tuple[int, int], str] = {}  # key -> why its capture was given up (eager)
        self.pool_bytes: dict[int | tuple[int, int], int] = {}  # key -> bytes its capture added to the reserved memory
        self._moe = [m for m in net.modules() if isinstance(m, MoE)]
        self._slabs: dict[int, bool] = {}  # rows -> whether they take the slab experts (_slab_experts)

    def bucket(self, n: int, last: bool = True, start: int | None = None) -> int | None:
        """The padded length the forward of an n-token prompt at position start (None: the cache's
        n_past) runs at now, or None: eagerly."""
        key = self._key(n, last, self.cache.n_past if start is None else start)
        return key if key is None or isinstance(key, int) else key[0]

    def _key(self, n: int, last: bool, start: int) -> int | tuple[int, int] | None:
        cache = self.cache
        if self.mode == "eager" or not last or not 2 <= n <= min(self.largest, cache.max_ctx):
            return None
        rows = prompt_bucket(n, self.first)
        if rows >= SLAB_EAGER_ROWS and self._slab_experts(rows):
            return None
        if not start:
            key = min(rows, cache.max_ctx)
        else:
            span = next(s for s in self.spans if s >= start + n) if start + rows <= cache.max_ctx else 0
            scores = not attention_layer.continue_sdpa(rows)  # it runs attend: scores over rows x span in the pool
            limit = min(self.largest, PROMPT_LAST_SCORES) if scores else self.largest
            if (not self.continued or not span or rows * span > limit ** 2
                    or attention_layer.PREFILL_ATTENTION == "kernel"):
                return None
            key = rows, span
        return None if key in self.failed else key

    def _slab_experts(self, rows: int) -> bool:
        """Whether a forward of rows tokens runs some MoE layer's experts on 16-bit slabs (MoE.slab_experts): from
        SLAB_EAGER_ROWS such a prompt runs eagerly, as a capture keeps the grouped GEMMs."""
        if rows not in self._slabs:
            device = self.cache.device
            self._slabs[rows] = any(m.slab_experts(rows, device) is not None for m in self._moe)
        return self._slabs[rows]

    def replays(self, n: int, last: bool = True, start: int = 0) -> bool:
        """Whether an n-token prompt at position start replays a graph."""
        return self.mode == "graphs" and self._key(n, last, start) is not None

    def continues(self, n: int, start: int, last: bool = True) -> bool:
        """Whether an n-token prompt whose first start tokens the cache holds should continue there
        (prompt_store.PromptCache) rather than run whole: unless only the whole prompt replays a graph, or
        (rule "share") both do and the cache holds less than CONTINUE_MIN_SHARE of the prompt. H200, 12 layers
        of qwen3-30b-a3b: a continued graph beat the whole prompt at 80-1648 tokens (1.1-5.3x), a whole
        prompt's graph beat continuing eagerly up to 1024 tokens (docs/performance.md, graphs13)."""
        if not self.replays(n, last):
            return True
        return self.replays(n - start, last, start) and (self.rule == "always" or start >= CONTINUE_MIN_SHARE * n)

    @torch.inference_mode()
    def __call__(self, tokens: torch.Tensor, last: bool = False) -> torch.Tensor:
        n, start = tokens.shape[0], self.cache.n_past
        key = self._key(n, last, start)
        if key is not None:
            feed = self._feed(key, tokens, start)
            if self.mode == "graphs" and key not in self._graphs and not self._capture(key, feed):
                key = None  # the capture just failed: this prompt runs eagerly too
        if key is None:
            return self.net(tokens, self.cache, last=last)
        if self.mode == "graphs":
            graph, inputs, logits = self._graphs[key]
            inputs.copy_(feed)
            graph.replay()
        else:
            logits = self._run(feed.to(self.cache.device), key)
        self.cache.n_past += n
        return logits.cpu()

    def prepare(self, n: int) -> None:
        """Capture the graph an n-token prompt from an empty cache will replay now, not on first use
        (its warm-up and capture write K/V rows the prompt rewrites)."""
        key = self._key(n, True, 0)
        if self.mode == "graphs" and key is not None and key not in self._graphs:
            self._capture(key, self._feed(key, torch.zeros(0, dtype=torch.long), 0))

    def warm(self, lengths: Sequence[int] | None = None) -> int:
        """Capture now the buckets of prompts of these lengths from an empty cache (None: every
        bucket up to largest and the context), the longest first: the shared pool's segments are then
        cut to the largest bucket's activations and the shorter buckets reuse them (captured shortest
        first, each longer bucket needs segments the pool lacks: H200, qwen3-30b-a3b 12 layers, all 17
        buckets up to 1024 left 968 MiB against 384 for the 1024 bucket alone). Lengths past the
        context are refused. Continued graphs are captured on their first prompt. Returns how many
        graphs are held."""
        ctx = self.cache.max_ctx
        if lengths is None:
            lengths = sorted({min(span, ctx) for span in prompt_buckets(min(self.largest, ctx), self.first)})
        elif too_long := [n for n in lengths if n > ctx]:
            raise EngineError(f"could not capture prompt graphs for {too_long[0]} tokens: the context is {ctx} "
                              "positions (raise --ctx or list shorter prompts in --prompt-graphs)")
        for n in sorted(lengths, reverse=True):
            self.prepare(n)
        return len(self._graphs)

    @staticmethod
    def _feed(key: int | tuple[int, int], tokens: torch.Tensor, start: int) -> torch.Tensor:
        """The graph's input on the host: the tokens padded to the bucket, a continued graph's
        positions start.. next, then the last real token's row."""
        rows = key if isinstance(key, int) else key[0]
        feed = torch.zeros(rows + 1 if isinstance(key, int) else 2 * rows + 1, dtype=torch.long)
        n = tokens.shape[0]
        feed[:n], feed[-1] = tokens, max(n - 1, 0)
        if not isinstance(key, int):
            feed[rows:2 * rows] = torch.arange(start, start + rows)
        return feed

    def _run(self, inputs: torch.Tensor, key: int | tuple[int, int]) -> torch.Tensor:
        if isinstance(key, int):  # positions 0..key-1 on the host, as positions() gives them from an empty cache
            return self.net.run(inputs[:key], torch.arange(key), self.cache, last=inputs[key:])
        rows, span = key
        self.cache.span = span  # the static mode: positions on the device, attention over [0, span)
        try:
            return self.net.run(inputs[:rows], inputs[rows:2 * rows], self.cache, last=inputs[2 * rows:])
        finally:
            self.cache.span = None

    @staticmethod
    def _name(key: int | tuple[int, int]) -> str:
        return f"prompt graph {key} tokens" if isinstance(key, int) else \
            f"continued prompt graph {key[0]} tokens over {key[1]} rows"

    @torch.inference_mode()
    def _capture(self, key: int | tuple[int, int], feed: torch.Tensor) -> bool:
        """Capture key's graph into _graphs (True), or give the key up (False, logged). The warm-up
        runs feed's forward (a continued one writes the rows the replay writes: the cache before
        n_past is only read)."""
        device, room = self.cache.device, self._room
        room.stage, t0 = "warm-up", time.perf_counter()
        try:
            inputs = feed.to(device)
            # the eager forward once first: its peak is what the capture will take from the pool
            graph, logits = capture(device, self._pool, lambda: room.warm(lambda: self._run(inputs, key)),
                                    lambda: self._run(inputs, key), ready=room.ready)
        except Exception as exc:  # any failure: the prompt runs eagerly, not the request failing
            why = str(exc) if isinstance(exc, NoRoom) else f"{room.stage} failed: {failure(exc)}"
        else:
            self._pool = graph.pool()
            self._graphs[key] = graph, inputs, logits
            self.pool_bytes[key] = room.added()
            self.log(f"{self._name(key)}: captured in {1e3 * (time.perf_counter() - t0):.0f} ms, "
                     f"pool +{mib(self.pool_bytes[key])} (prompt graphs hold {mib(sum(self.pool_bytes.values()))})")
            return True
        inputs = None  # noqa: F841 (the closures' cell: frees the tensor)
        release(device)
        self.failed[key] = why
        self.log(f"{self._name(key)} not captured, its prompts run eagerly: {why}")
        return False

    def stats(self) -> dict[str, int]:
        """captured and failed keys (buckets and continued ones), and pool_bytes: the bytes the captures
        added (for /metrics)."""
        return {"captured": len(self._graphs), "failed": len(self.failed), "pool_bytes": sum(self.pool_bytes.values())}


def prompt_blocker(net: Decoder) -> str | None:
    """Why PromptForward's graphs cannot serve the network's prompts (beyond graph_blocker's
    reasons, which the caller checked): a layer without GQA attention, or None."""
    for il, block in enumerate(net.blocks):
        if type(block.attn) is not Attention:
            return f"layer {il}: {type(block.attn).__name__} (prompt graphs run GQA attention only)"
    return None


def prompt_forward(net: Decoder, cache: KVCache, graphs: bool, log: Callable[[str], None] = lambda line: None,
                   enabled: bool = True, margin: int = PROMPT_MARGIN) -> PromptForward:
    """The prompt's forward over cache: graphs where the decode step is captured (graphs, from
    use_graphs), enabled (--prompt-graphs off is not), SPARKD_PREFILL_GRAPHS is on and prompt_blocker
    finds nothing (logged), else eager; continued graphs unless SPARKD_CONTINUE_GRAPHS is off. margin:
    PromptForward's free-memory margin."""
    if not graphs or not enabled or not prefill_graphs_default():
        return PromptForward(net, cache, "eager")
    if why := prompt_blocker(net):
        log(f"prompts run eagerly: {why}")
        return PromptForward(net, cache, "eager")
    return PromptForward(net, cache, margin=margin, log=log, continued=continue_graphs_default(),
                         rule=continue_rule_default())
