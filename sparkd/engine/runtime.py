"""The one object the server drives: load a model (with progress), check its memory plan,
tokenize prompts, and generate tokens one at a time with cancellation.

The server never touches the network, the KV cache or the expert store directly, so the
streaming expert store (and its cache resize) slots in here without changing the server.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from sparkd.engine.chat import THINK_TAGS, ChatTemplate
from sparkd.engine.errors import EngineError
from sparkd.engine.layers.kv_cache import KV_TYPES, kv_type_name
from sparkd.engine.models.decoder import prompt_last_only
from sparkd.engine.models.weights import kernel_rule
from sparkd.engine.prompt_chunks import chunk_tokens, reserved_workspace, room_bytes
from sparkd.engine.prompt_store import PromptCache, PromptStore, store_bytes
from sparkd.engine.sampler import Sampler, SamplingParams
from sparkd.engine.streaming.device import CPU, DeviceInfo, probe_device, vram_margin_bytes
from sparkd.engine.streaming.plan import (EXPERT_WEIGHT, Budget, MemoryPlan, cache_kv_type, context_for, kv_bytes,
                                         resident_bytes, rope_bytes)
from sparkd.engine.streaming.session import StreamingModel, StreamOptions, open_streaming
from sparkd.engine.think import CLOSE, OPEN, TagMatcher, ThinkTags, find_think_tags
from sparkd.engine.tokenizer import Tokenizer

Progress = Callable[[int, int], None]  # (bytes loaded, bytes total)


class NoExpertCache(EngineError):
    """The engine keeps every expert resident, so there is no expert cache to resize."""


class MemoryPlanError(EngineError):
    """The model does not fit in the memory budget."""


def resident_plan(gguf: Any, cfg: Any, ctx: int, kv_type: str, budget_bytes: int | None,
                  store_request: int | None, device: DeviceInfo = CPU) -> dict[str, int]:
    """The plan of a model loaded whole (dense models, --resident): every tensor as the loader holds it
    (plan.resident_bytes: f32 on the CPU, the kernels' file bytes on a GPU), the KV cache, rope tables and the
    prompt store's budget. On a discrete GPU all of them live in the device's memory, so they are held against its
    free memory less the VRAM margin, not against --budget, the host's (before session 40 a --budget refused a
    model the device held, and nothing refused one it could not hold until CUDA ran out mid-load); elsewhere
    (the CPU, an integrated GPU sharing the host's memory) against --budget. MemoryPlanError names every term."""
    trunk, experts = resident_bytes(gguf, cfg.n_layer, None if device.kind == "cpu" else kernel_rule())
    kv, rope = kv_bytes(cfg, ctx, kv_type), rope_bytes(cfg, ctx)
    if device.discrete:
        margin = vram_margin_bytes(device)
        limit = device.free_bytes - margin
        against = f"{device.name}'s {_mib(device.free_bytes)} free less a {_mib(margin)} margin"
        advice = "lower --ctx or --prompt-cache-mib, or " + (
            "serve without --resident to stream the routed experts" if experts else "use a smaller quantization")
    else:
        limit, against = budget_bytes, f"--budget {_mib(budget_bytes or 0)}"
        advice = "lower --ctx or --prompt-cache-mib, or raise the budget"
    room = None if limit is None else limit - trunk - kv - rope - experts
    store = store_bytes(store_request, budget_bytes, room)
    plan = {"trunk": trunk, "kv": kv, "rope": rope, "experts_resident": experts, "expert_cache": 0,
            "prompt_store": store}
    if budget_bytes is not None:
        plan["budget"] = budget_bytes
    need = trunk + kv + rope + experts + store
    if limit is not None and need > limit:
        raise MemoryPlanError(
            f"could not plan memory for {gguf.path}: trunk {_mib(trunk)} + KV {_mib(kv)} "
            f"+ rope tables {_mib(rope)} ({ctx} positions) + resident experts {_mib(experts)} "
            f"+ prompt store {_mib(store)} = {_mib(need)} exceeds {against}; {advice}")
    return plan


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    think: ThinkTags | None = None
    starts_in_reasoning: bool = False
    reasoning_budget: int | None = None  # reasoning tokens before </think> is forced; None: unlimited
    cached_tokens: int = 0  # set by Engine.generate: prompt tokens whose K/V the prompt cache held


class Engine:
    """One model, one decode slot: callers serialise generate() (the server's slot does)."""

    def __init__(self, model_path: str | Path, *, ctx: int | None = None, budget_bytes: int | None = None,
                 chat_template: str | None = None, threads: int | None = None, resident: bool = False,
                 stream: StreamOptions | None = None, log: Callable[[str], None] | None = None,
                 device: str = "cpu", cuda_graphs: str = "auto", prompt_graphs: str = "auto",
                 prompt_graph_margin: int | None = None, prompt_cache: bool = True,
                 prompt_store_bytes: int | None = None, decode_graphs: str = "auto", kv_type: str = "auto"):
        from sparkd.engine.cuda_graphs import parse_decode_graphs
        from sparkd.engine.prompt_graphs import PROMPT_MARGIN, parse_prompt_graphs

        self.threads = threads
        self.cuda_graphs = cuda_graphs  # auto|on|off: the decode step as CUDA graphs (cuda_graphs.py)
        # auto|lazy|off or prompt lengths: the prompt graphs captured at load (--prompt-graphs)
        self.prompt_graphs = parse_prompt_graphs(prompt_graphs)
        # auto|lazy or positions: the decode steps' buckets captured at load (--decode-graphs)
        self.decode_graphs = parse_decode_graphs(decode_graphs)
        self.prompt_graph_margin = PROMPT_MARGIN if prompt_graph_margin is None else prompt_graph_margin
        if self.prompt_graph_margin < 0:
            raise EngineError(f"could not use --prompt-graph-margin {prompt_graph_margin}: it must be 0 or more")
        self.device = device  # "cuda": trunk on the GPU; streamed experts read in place (zero-copy)
        self.kv_type = kv_type_name(kv_type, device)  # the K/V rows: f16 or f32 (--kv-type, auto resolved)
        self.model_path = Path(model_path)
        self.requested_ctx = ctx
        self.budget_bytes = budget_bytes
        self.resident = resident  # every expert in memory, no plan beyond --budget (measurement)
        self._stream = stream or StreamOptions()
        self._log = log or (lambda line: None)
        self._template_source = chat_template
        self.n_ctx = 0
        self.gguf = self.cfg = self.net = self.tokenizer = self.template = None
        self.think: ThinkTags | None = None
        self.streaming: StreamingModel | None = None
        self._cache = None
        self._step = None  # graph_step.decode_step over _cache (StaticDecode, the streamed step or EagerDecode)
        self._prompt = None  # prompt_graphs.PromptForward over _cache (graphs of the padded prompt, or eager)
        self._plan: dict[str, int] = {}
        self.prompt_cache = prompt_cache  # continue the cache at the prompt's common prefix (PromptCache)
        self._held = PromptCache()
        if prompt_store_bytes is not None and prompt_store_bytes < 0:
            raise EngineError(f"could not use a prompt store of {prompt_store_bytes} bytes: it must be 0 or more")
        # the prompt store's budget (None: auto, prompt_store.store_bytes); 0 with the prompt cache off
        self._store_request = prompt_store_bytes if prompt_cache else 0
        self._store: PromptStore | None = None  # the conversations the live cache gave up (prompt_store.py)

    # --- loading ------------------------------------------------------------------------------

    def load(self, progress: Progress | None = None) -> None:
        """Routed experts stream under the memory plan (open_streaming, like `generate`) unless
        the engine is resident or the model is dense; either way the plan is checked first."""
        from sparkd.engine.gguf_file import GGUFModel
        from sparkd.engine.models import config_of, load_model

        if self.threads is not None:
            torch.set_num_threads(self.threads)  # process-wide: the engine owns this process
        peek = GGUFModel.open(self.model_path)
        try:
            cfg = config_of(peek)
            self.n_ctx = context_for(self.requested_ctx, cfg.n_ctx_train)
            stream = not self.resident and any(EXPERT_WEIGHT.match(n) for n in peek.tensors)
            if not stream:
                self._plan = resident_plan(peek, cfg, self.n_ctx, self.kv_type, self.budget_bytes,
                                           self._store_request, probe_device(self.device))
        except BaseException:
            peek.close()
            raise
        if stream:
            peek.close()
            self.streaming = open_streaming(self.model_path, replace(self._stream, budget_bytes=self.budget_bytes,
                                                                     ctx=self.n_ctx, device=self.device,
                                                                     prompt_store_bytes=self._store_request,
                                                                     kv_type=self.kv_type),
                                            on_plan=self._on_plan, warn=self._log, progress=progress)
            model = self.streaming.model
        else:
            model = load_model(peek, progress=progress, device=self.device)
        try:
            self._finish_load(model)
        except BaseException:
            (self.streaming or model).close()
            self.streaming = None
            raise

    def _on_plan(self, budget: Budget, plan: MemoryPlan) -> None:
        if budget.warning:
            self._log(f"WARNING: {budget.warning}")
        self._log(f"memory plan:\n{plan.describe()}")
        self._plan = {"budget": plan.budget_bytes, "runtime": plan.runtime_bytes, "slack": plan.slack_bytes,
                      "trunk": plan.trunk_bytes, "kv": plan.kv_bytes, "rope": plan.rope_bytes,
                      "workspace": plan.workspace_bytes,
                      "prefetch": plan.prefetch_bytes, "expert_cache": plan.expert_cache_bytes,
                      "cuda_runtime": plan.cuda_runtime_bytes, "staging": plan.staging_bytes,
                      "vram_expert_cache": plan.vram_cache_bytes, "device_total": plan.device_total_bytes,
                      "prompt_store": plan.prompt_store_bytes}

    def _finish_load(self, model: Any) -> None:
        from sparkd.engine.cuda_graphs import use_graphs
        from sparkd.engine.models import warm_experts
        from sparkd.engine.prompt_graphs import prompt_forward
        from sparkd.engine.streaming.graph_step import decode_step

        graphs = use_graphs(self.cuda_graphs, model.net, self.device, self.streaming is not None, self._log)
        self.cfg = model.cfg
        self.kv_type = cache_kv_type(model.cfg, self.kv_type)  # the type the rows take (DeepSeek V4's: f32)
        self.tokenizer = Tokenizer(model.gguf.metadata, str(self.model_path))
        self.template = self._chat_template(model.gguf.metadata)
        self.think = self._think_tags()
        if self.streaming is None:
            warm_experts(model.net)
        self._cache = model.net.new_cache(self.n_ctx, KV_TYPES[self.kv_type])
        if self._plan["prompt_store"]:
            self._store = PromptStore(self._plan["prompt_store"])
        # the prompt graphs' margin covers the decode steps' captures too
        self._step = decode_step(model.net, self._cache, self.device, graphs, self.streaming is not None,
                                 self.cuda_graphs, self._log, self.prompt_graph_margin)
        self._prompt = prompt_forward(model.net, self._cache, graphs, self._log, self.prompt_graphs != "off",
                                      self.prompt_graph_margin)
        if self.device != "cpu":  # JIT-compile the kernels (the linked norms' too) now, not in the first request
            scratch = model.net.new_cache(3, KV_TYPES[self.kv_type])
            model.net(torch.tensor([0, 0]), scratch)
            model.net(torch.tensor([0]), scratch)
        if graphs:  # the buckets' captures and the draw chains' first run and graphs now, not in a request
            self._warm_decode_graphs()
            if not self._capture_draws():  # (a capture's warm-up is its chain's first run)
                self._step.warm_sampling()
        elif self.decode_graphs not in ("auto", "lazy"):
            self._log(f"--decode-graphs {','.join(map(str, self.decode_graphs))} ignored: the decode step runs "
                      "eagerly here")
        self._warm_prompt_graphs()
        if self.streaming is None:
            self._reserve_workspace(model.cfg)
        self.gguf, self.net = model.gguf, model.net

    def _reserve_workspace(self, cfg: Any) -> None:
        """A resident model's workspace term: what a prompt filling the context takes in the largest chunks the
        memory left after the load holds (prompt_chunks.py); the streaming plan has its own."""
        cuda = self.device != "cpu"
        room = room_bytes(self.device, self.budget_bytes, self._plan["prompt_store"])
        whole, reserved = reserved_workspace(cfg, self.n_ctx, room, cuda)
        self._plan["workspace"] = reserved
        if whole < self.n_ctx:  # (a prompt of up to the whole context in one forward needs no word)
            self._log(f"prompt workspace {_mib(reserved)} of {_mib(max(0, room))} free: a prompt filling the "
                      f"{self.n_ctx} positions runs in chunks of {whole} tokens")
        if reserved > room:
            self._log(f"WARNING: a prompt of {self.n_ctx} tokens needs {_mib(reserved)} in chunks of {whole} tokens, "
                      f"and {_mib(max(0, room))} is free after the load; lower --ctx or raise the budget")

    def _warm_decode_graphs(self) -> None:
        """--decode-graphs: capture the step graphs of every bucket (auto), the first (lazy) or the listed
        positions' and the first, each logged by StaticDecode, so a reply crossing a bucket captures nothing;
        a summary with the pool they hold."""
        choice, step = self.decode_graphs, self._step
        t0 = time.perf_counter()
        held = step.warm(None if choice == "auto" else () if choice == "lazy" else choice)
        stats = step.stats()
        self._log(f"decode graphs at load: {held} held, {stats['failed']} given up, in "
                  f"{time.perf_counter() - t0:.2f} s; their pool {_mib(stats['pool_bytes'])}")

    def _capture_draws(self) -> bool:
        """$SPARKD_LOAD_DRAW_GRAPHS: capture every sampler path's draw graph in the buckets captured so far
        (StaticDecode.capture_draws), so no temperature request pays one; logged with each graph's time and
        the device memory it holds. Whether any was captured: each capture ran its chain once in its warm-up,
        so DeviceSampler.warm would run them a second time."""
        from sparkd.engine.cuda_graphs import load_draw_graphs_default

        if not load_draw_graphs_default():
            return False
        t0 = time.perf_counter()
        done = self._step.capture_draws()
        failed = sum(isinstance(key, tuple) for key in self._step.failed)  # a draw's key: (span, path)
        if done or failed:
            each = ", ".join(f"{span}/{path} {seconds * 1e3:.0f} ms {held / 2**20:+.1f} MiB"
                             for span, path, seconds, held in done)
            self._log(f"draw graphs at load: {len(done)} held ({each}), {failed} given up, in "
                      f"{time.perf_counter() - t0:.2f} s; they hold {_mib(sum(held for *_, held in done))}")
        return bool(done)

    def _warm_prompt_graphs(self) -> None:
        """--prompt-graphs: capture the listed (auto: all) prompt buckets now, each logged by
        PromptForward, so no request pays a capture; ignored, and said so, where prompts run eagerly."""
        choice = self.prompt_graphs
        if choice in ("lazy", "off"):
            return
        if self._prompt.mode != "graphs":
            if choice != "auto":
                self._log(f"--prompt-graphs {','.join(map(str, choice))} ignored: prompts run eagerly here")
            return
        t0 = time.perf_counter()
        held = self._prompt.warm(None if choice == "auto" else choice)
        stats = self._prompt.stats()
        self._log(f"prompt graphs at load: {held} held, {stats['failed']} given up, in "
                  f"{time.perf_counter() - t0:.1f} s; their pool {_mib(stats['pool_bytes'])}")

    def prompt_store_stats(self) -> dict[str, int] | None:
        """The prompt store's bytes and entries now, saves, restores and evictions (PromptStore.stats),
        or None without a store (--prompt-cache off, --prompt-cache-mib 0)."""
        return None if self._store is None else self._store.stats()

    def decode_graph_stats(self) -> dict[str, int] | None:
        """The decode steps' and draws' captured and failed graphs and their pool bytes (StaticDecode.stats),
        or None where the decode step is not captured."""
        stats = getattr(self._step, "stats", None)  # StaticDecode's; the streamed and eager steps have none
        return stats() if stats is not None and getattr(self._step, "graphs", False) else None

    def prompt_graph_stats(self) -> dict[str, int] | None:
        """The prompt graphs' captured and failed buckets and pool bytes (PromptForward.stats), or
        None where prompts run eagerly."""
        prompt = self._prompt
        return prompt.stats() if prompt is not None and prompt.mode == "graphs" else None

    def _chat_template(self, metadata: Mapping[str, Any]) -> ChatTemplate | None:
        if self._template_source is not None:
            return ChatTemplate(self._template_source, *self._bos_eos(), origin="--chat-template-file")
        if metadata.get("tokenizer.chat_template"):
            return ChatTemplate.from_metadata(metadata, self.tokenizer, origin=str(self.model_path))
        return None

    def _bos_eos(self) -> tuple[str, str]:
        t = self.tokenizer
        return (t.tokens[t.bos_id] if t.bos_id is not None else "",
                t.tokens[t.eos_id] if t.eos_id is not None else "")

    def _think_tags(self) -> ThinkTags | None:
        return find_think_tags(self.tokenizer, THINK_TAGS)

    # --- what the server asks -----------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self.net is not None

    def memory_plan(self) -> dict[str, int]:
        """Bytes per plan term: streaming: budget, runtime, slack, trunk, kv, workspace, prefetch,
        expert_cache (as allocated), ...; resident: trunk, kv, experts_resident, expert_cache, workspace (its
        prompts' chunks, prompt_chunks.py), budget if set;
        both: prompt_store (its budget)."""
        return dict(self._plan)

    def cache_stats(self) -> dict[str, Any] | None:
        """The expert store's counters (store.snapshot(): requests, hits, evictions, bytes_read,
        read_seconds, ...) plus cache_bytes, its size now; None while experts are resident."""
        if self.streaming is None:
            return None
        store = self.streaming.store
        return store.snapshot() | {"cache_bytes": store.capacity * self.streaming.plan.slot_bytes}

    def resize_cache(self, budget_bytes: int) -> dict[str, int]:
        """Shrink the expert cache, or grow it back up to what the plan allocated; returns
        {cache_bytes: the size now, previous_bytes: the size before, allocated_bytes: the plan's}.
        EngineError beyond those bounds."""
        if self.streaming is None:
            raise NoExpertCache(
                f"could not resize the expert cache to {_mib(budget_bytes)}: this engine keeps every routed "
                f"expert resident ({_mib(self._plan.get('experts_resident', 0))}), so there is no expert "
                "cache; serve without --resident to stream experts")
        previous = self.streaming.store.capacity * self.streaming.plan.slot_bytes
        size = self.streaming.store.resize(budget_bytes)
        return {"cache_bytes": size, "previous_bytes": previous, "allocated_bytes": self.streaming.plan.expert_cache_bytes}

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]]) -> tuple[list[int], bool]:
        """(prompt ids, whether the prompt ends inside an opened reasoning block)."""
        if self.template is None:
            raise EngineError(f"could not render a chat prompt: {self.model_path} has no chat template "
                              "(use /v1/completions, or start with --chat-template-file)")
        text = self.template.render(messages, add_generation_prompt=True)
        inside = self.think is not None and text.rstrip().endswith(self.think.open_text)
        return self.tokenizer.encode(text, add_special=True, parse_special=True), inside

    def text_prompt(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special=True, parse_special=False)

    def generate(self, req: GenerationRequest, cancel: threading.Event) -> Iterator[int]:
        """Token ids, one per step, until max_tokens, an end-of-generation token (yielded, then
        stop) or cancel is set. The reasoning budget forces the close tag when it runs out."""
        if not self.loaded:
            raise EngineError("could not generate: the model is not loaded yet")
        sample = Sampler(req.sampling)
        bias = _bias_vector(req.logit_bias, self.cfg.n_vocab)
        cache, held = self._cache, self._held
        ids = req.prompt_ids
        last = prompt_last_only()
        keep = self._continue_at(ids, last)
        req.cached_tokens = keep
        tokens = held.begin(ids[:keep])  # claims nothing until written: a failure leaves the cache unclaimed
        if keep:
            cache.n_past = keep
        else:
            cache.reset()
        batch = (self.streaming.plan.batch_tokens if self.streaming
                 else chunk_tokens(self.cfg, keep, len(ids) - keep, self._plan["workspace"], self.device != "cpu"))
        logits = held.logits if keep == len(ids) else None
        for i in range(keep, len(ids), batch):  # chunks the plan's workspace holds
            logits = self._prompt(torch.tensor(ids[i:i + batch]), last=last)[-1]
        held.written(tokens, ids[keep:], ids, logits)
        history = list(req.prompt_ids)
        budget = _ReasoningBudget(req)
        # the step's device picks (greedy) or draws (temperature, graph step only): one int comes
        # back instead of the logits row; a drawing request's first token is drawn there too (pick_from)
        drawing = self._step.begin_sampling(req.sampling, history, bias)
        on_device = drawing or (self._step.device_argmax and bias is None and sample.plain_argmax)
        if on_device and self.streaming is None and self._step.pipeline:
            first = budget.forced()
            if first is None:
                first = self._step.pick_from(logits, sample, history, bias)
            yield from self._pipelined(req, cancel, first, budget, history, tokens)
            return
        picked = None
        for _ in range(req.max_tokens):
            if cancel.is_set():
                return
            token = budget.forced()
            if token is None:
                token = picked if picked is not None else self._step.pick_from(logits, sample, history, bias)
            yield token
            if token in self.tokenizer.eog_ids:
                return
            budget.push(token)
            history.append(token)
            if cache.n_past >= cache.max_ctx:
                return
            held.begin(tokens)
            if on_device:
                picked = self._step.next_token(token)
            else:
                logits = self._step(token)[-1]
            held.written(tokens, [token])
            if self.streaming is not None:
                self.streaming.store.note_tokens(1)

    def _pipelined(self, req: GenerationRequest, cancel: threading.Event, token: int,
                   budget: "_ReasoningBudget", history: list[int], tokens: list[int]) -> Iterator[int]:
        """generate's decode loop from its first token on, with the step of each next token launched
        before the host reads this step's pick (StaticDecode.launch: fed that pick on the device, or
        the token the reasoning budget forces), so the GPU does not idle while the host wakes up: the
        same tokens, n_past and claimed rows as the loop in generate. The forced token, max_tokens and
        the context are known before the pick, so a step launched ahead is wrong only when the request
        ends (an end-of-generation pick, a cancel, the caller closing this iterator): dropped then.
        The claim grows by a token once it is accepted; the step launched ahead writes only the row
        past it (the cache has no recurrent state: StaticDecode.pipeline)."""
        step, cache, held = self._step, self._cache, self._held
        ahead = 0  # the number of the next token's step where it is launched
        forced = None  # the next token where the reasoning budget forces it
        try:
            for i in range(req.max_tokens):
                if cancel.is_set():
                    return
                if i:
                    picked = step.pick()  # read even when forced: the next launch needs its host slot
                    token = picked if forced is None else forced
                yield token
                if token in self.tokenizer.eog_ids:
                    return
                budget.push(token)
                history.append(token)
                forced = budget.forced()  # the next token's, asked once (it pops the close tag's ids)
                if not ahead:  # the first token, or one the context had no room for ahead
                    if cache.n_past >= cache.max_ctx:
                        return
                    step.launch(token)
                held.written(tokens, [token])
                ahead = 0
                if i + 1 < req.max_tokens and cache.n_past < cache.max_ctx:
                    ahead = step.launch(forced)  # None: this step's pick, on the device
        finally:
            if ahead:
                step.drop(ahead)

    def _continue_at(self, ids: list[int], last: bool) -> int:
        """How many leading positions of ids the cache keeps: the longest prefix the live cache or a
        stored conversation holds (the latter copied into place); the live cache's claimed rows go to
        the store first unless ids extend them."""
        cache, held, store = self._cache, self._held, self._store
        if not self.prompt_cache:
            return 0
        keep = held.reusable(ids, cache.rewind_limit)
        entry, stored = store.best(ids, cache.rewind_limit) if store is not None else (None, 0)
        if stored > keep:
            keep = stored
        else:
            entry = None
        if 0 < keep < len(ids) and not self._prompt.continues(len(ids), keep, last):
            keep, entry = 0, None  # only the whole prompt replays (prefix13), or the cache holds too little (attn28)
        live = held.tokens
        if store is not None and live and ids[:len(live)] != live:  # this prompt overwrites rows it does not extend
            store.save(cache, held)
        if entry is not None:
            store.restore(entry, cache, held, keep)
        return keep

    def close(self) -> None:
        if self.streaming is not None:
            self.streaming.close()
        elif self.gguf is not None:
            self.gguf.close()


class _ReasoningBudget:
    """Counts reasoning tokens; once the budget is spent, forces the close tag one token a step
    (only what completes it, when the model already began writing it)."""

    def __init__(self, req: GenerationRequest):
        self._tags = TagMatcher(req.think) if req.think is not None else None
        self._limit = req.reasoning_budget
        self.inside, self.thought = req.starts_in_reasoning, 0
        self._forcing: list[int] = []

    def forced(self) -> int | None:
        if self._tags is None or self._limit is None or not self.inside:
            return None
        if not self._forcing and self.thought >= self._limit:
            self._forcing = self._tags.rest_of(CLOSE)
        return self._forcing.pop(0) if self._forcing else None

    def push(self, token: int) -> None:
        if self._tags is None:
            return
        for item in self._tags.push(token):
            if item in (OPEN, CLOSE):
                self.inside = item == OPEN
                self._forcing = []
            elif self.inside:
                self.thought += 1


def _bias_vector(bias: Mapping[int, float], n_vocab: int) -> torch.Tensor | None:
    if not bias:
        return None
    v = torch.zeros(n_vocab)
    for tid, b in bias.items():
        v[tid] = b
    return v


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
