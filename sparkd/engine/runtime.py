"""The one object the server drives: load a model (with progress), check its memory plan,
tokenize prompts, and generate tokens one at a time with cancellation.

The server never touches the network, the KV cache or the expert store directly, so the
streaming expert store (and its cache resize) slots in here without changing the server.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from sparkd.engine.chat import THINK_TAGS, ChatTemplate
from sparkd.engine.errors import EngineError
from sparkd.engine.sampler import Sampler, SamplingParams

# Without --ctx the KV cache covers this many positions (or the model's training context if
# smaller): a model's full training context (40k-160k) would cost GBs of f32 KV it rarely uses.
DEFAULT_CTX = 4096
Progress = Callable[[int, int], None]  # (bytes loaded, bytes total)


class NoExpertCache(EngineError):
    """The engine keeps every expert resident, so there is no expert cache to resize."""


class MemoryPlanError(EngineError):
    """The model does not fit in the memory budget."""


@dataclass(frozen=True)
class ThinkTags:
    """Token ids that open and close a reasoning block, when both are single tokens."""

    open_id: int
    close_id: int
    open_text: str
    close_text: str


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    think: ThinkTags | None = None
    starts_in_reasoning: bool = False
    reasoning_budget: int | None = None  # reasoning tokens before </think> is forced; None: unlimited


class _CountingWeights:
    """Wraps Weights.get so loading reports bytes read against the file's tensor bytes."""

    def __init__(self, weights: Any, progress: Progress, total_bytes: int):
        self._w, self._progress, self._total = weights, progress, total_bytes
        self.done_bytes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        t = self._w.get(name, shape)
        self.done_bytes += self._w.model.tensor(name).nbytes
        self._progress(self.done_bytes, self._total)
        return t

    # Weights' helpers call self.get; route them through the counting get.
    def linear(self, prefix, shape=None):
        from sparkd.engine.layers.linear import Linear
        return Linear(self.get(f"{prefix}.weight", shape), self.maybe(f"{prefix}.bias"))

    def maybe(self, name):
        return self.get(name) if self._w.has(name) else None

    def maybe_linear(self, prefix):
        return self.linear(prefix) if self._w.has(f"{prefix}.weight") else None

    def norm(self, name, eps):
        from sparkd.engine.layers.norm import RMSNorm
        return RMSNorm(self.get(f"{name}.weight"), eps)

    def maybe_norm(self, name, eps):
        return self.norm(name, eps) if self._w.has(f"{name}.weight") else None


class Engine:
    """One model, one decode slot: callers serialise generate() (the server's slot does)."""

    def __init__(self, model_path: str | Path, *, ctx: int | None = None, budget_bytes: int | None = None,
                 chat_template: str | None = None, threads: int | None = None):
        self.threads = threads
        self.model_path = Path(model_path)
        self.requested_ctx = ctx
        self.budget_bytes = budget_bytes
        self._template_source = chat_template
        self.n_ctx = 0
        self.gguf = self.cfg = self.net = self.tokenizer = self.template = None
        self.think: ThinkTags | None = None
        self._cache = None
        self._plan: dict[str, int] = {}
        self._stream = None  # StreamingModel when the experts do not fit the budget
        self._prompt_chunk_tokens = 0  # 0: the whole prompt in one pass

    # --- loading ------------------------------------------------------------------------------

    def load(self, progress: Progress | None = None) -> None:
        from sparkd.engine.gguf_file import GGUFModel
        from sparkd.engine.layers.experts import ResidentExperts
        from sparkd.engine.models import arch_module, config_of
        from sparkd.engine.models.weights import Weights
        from sparkd.engine.tokenizer import Tokenizer

        if self.threads is not None:
            torch.set_num_threads(self.threads)  # process-wide: the engine owns this process
        gguf = GGUFModel.open(self.model_path)
        try:
            self.cfg = config_of(gguf)
            self.n_ctx = self._context(self.cfg.n_ctx_train)
            self._plan = self._memory_plan(gguf)
            if self._needs_streaming():
                gguf.close()
                return self._load_streaming(progress)
            self.tokenizer = Tokenizer(gguf.metadata, str(self.model_path))
            self.template = self._chat_template(gguf.metadata)
            self.think = self._think_tags()
            total = sum(t.nbytes for t in gguf.tensors.values())
            w = _CountingWeights(Weights(gguf), progress or (lambda done, tot: None), total)
            store = ResidentExperts(w.get, w.has)
            self.net = arch_module(self.cfg.arch).build(self.cfg, w, store)
            self._warm_experts(store)
            self._cache = self.net.new_cache(self.n_ctx)
        except BaseException:
            gguf.close()
            raise
        self.gguf = gguf

    def _context(self, n_ctx_train: int) -> int:
        if self.requested_ctx is None:
            return min(DEFAULT_CTX, n_ctx_train)
        if self.requested_ctx > n_ctx_train:
            raise EngineError(f"could not use --ctx {self.requested_ctx}: the model was trained for "
                              f"{n_ctx_train} positions")
        return self.requested_ctx

    def _memory_plan(self, gguf: Any) -> dict[str, int]:
        """Resident plan: every tensor dequantized to f32, plus the f32 KV cache."""
        from sparkd.engine.cli import _EXPERT_TENSOR

        experts = sum(4 * t.n_elements for n, t in gguf.tensors.items() if _EXPERT_TENSOR.match(n))
        trunk = sum(4 * t.n_elements for n, t in gguf.tensors.items() if not _EXPERT_TENSOR.match(n))
        kv = self._kv_bytes_per_position() * self.n_ctx
        plan = {"trunk": trunk, "kv": kv, "experts_resident": experts, "expert_cache": 0}
        if self.budget_bytes is not None:
            plan["budget"] = self.budget_bytes
            need = trunk + kv + experts
            # Routed experts that do not fit are streamed (see load); only the rest must fit.
            if trunk + kv > self.budget_bytes or (need > self.budget_bytes and not experts):
                raise MemoryPlanError(
                    f"could not plan memory for {self.model_path}: trunk {_mib(trunk)} + KV {_mib(kv)} "
                    f"({self.n_ctx} positions) + resident experts {_mib(experts)} = {_mib(need)} exceeds "
                    f"--budget {_mib(self.budget_bytes)}; lower --ctx or raise the budget")
        return plan

    def _needs_streaming(self) -> bool:
        p = self._plan
        return "budget" in p and p["trunk"] + p["kv"] + p["experts_resident"] > p["budget"]

    def _load_streaming(self, progress: Progress | None) -> None:
        """Routed experts streamed from disk through a cache sized by the streaming plan
        (printed on stderr, like `sparkd-engine plan`)."""
        from sparkd.engine.streaming.commands import print_plan
        from sparkd.engine.streaming.session import StreamOptions, open_streaming
        from sparkd.engine.tokenizer import Tokenizer

        sm = open_streaming(self.model_path, StreamOptions(budget_bytes=self.budget_bytes, ctx=self.n_ctx),
                            on_plan=print_plan)
        try:
            plan, meta = sm.plan, sm.model.gguf.metadata
            self._plan = {"trunk": plan.trunk_bytes, "kv": plan.kv_bytes, "experts_resident": 0,
                          "expert_cache": plan.expert_cache_bytes, "budget": plan.budget_bytes}
            self._prompt_chunk_tokens = plan.batch_tokens
            self.tokenizer = Tokenizer(meta, str(self.model_path))
            self.template = self._chat_template(meta)
            self.think = self._think_tags()
            self._cache = sm.model.net.new_cache(self.n_ctx)
        except BaseException:
            sm.close()
            raise
        self._stream, self.gguf, self.net = sm, sm.model.gguf, sm.model.net
        if progress:
            progress(1, 1)

    def _kv_bytes_per_position(self) -> int:
        c = self.cfg
        if c.kv_lora_rank:  # MLA caches one latent row plus the rope key part per layer
            return 4 * c.n_layer * (c.kv_lora_rank + c.rope.n_rot)
        return 4 * c.n_layer * c.n_head_kv * (c.head_dim_k + c.head_dim_v)

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
        ids = self.tokenizer.ids
        for open_text, close_text in THINK_TAGS:
            if open_text in ids and close_text in ids:
                return ThinkTags(ids[open_text], ids[close_text], open_text, close_text)
        return None

    def _warm_experts(self, store: Any) -> None:
        """Read every resident expert now, so the first request does not pay for it."""
        for il in range(self.cfg.n_layer):
            if self.cfg.is_moe_layer(il):
                store.get(il, [0])

    # --- what the server asks -----------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self.net is not None

    def memory_plan(self) -> dict[str, int]:
        """Bytes per plan term (trunk, kv, experts_resident, expert_cache, budget if set)."""
        return dict(self._plan)

    def cache_stats(self) -> dict[str, float] | None:
        """Expert cache counters (requests, hits, evictions, bytes_read, read_seconds,
        budget_bytes), or None while experts are resident (no cache)."""
        if self._stream is None:
            return None
        stats = self._stream.store.snapshot()
        stats["budget_bytes"] = self._stream.plan.expert_cache_bytes
        return stats

    def resize_cache(self, budget_bytes: int) -> dict[str, int]:
        """Shrink or grow the expert cache at run time; returns the new memory plan."""
        raise NoExpertCache(
            f"could not resize the expert cache to {_mib(budget_bytes)}: this engine keeps every routed "
            f"expert resident ({_mib(self._plan.get('experts_resident', 0))}), so there is no expert cache; "
            "expert streaming (a --budget below the model size) provides one")

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
        cache = self._cache
        cache.n_past = 0
        ids, chunk = req.prompt_ids, self._prompt_chunk_tokens or len(req.prompt_ids)
        for i in range(0, len(ids), chunk):  # chunks the streaming plan's workspace holds
            logits = self.net(torch.tensor(ids[i:i + chunk]), cache)[-1]
        history = list(req.prompt_ids)
        inside, thought = req.starts_in_reasoning, 0
        for _ in range(req.max_tokens):
            if cancel.is_set():
                return
            if inside and req.reasoning_budget is not None and thought >= req.reasoning_budget:
                token = req.think.close_id
            else:
                token = sample(logits if bias is None else logits + bias, history)
            yield token
            if token in self.tokenizer.eog_ids:
                return
            if req.think is not None:
                if token == req.think.open_id:
                    inside = True
                elif token == req.think.close_id:
                    inside = False
                elif inside:
                    thought += 1
            history.append(token)
            if cache.n_past >= cache.max_ctx:
                return
            logits = self.net(torch.tensor([token]), cache)[-1]
            if self._stream is not None:
                self._stream.store.note_tokens(1)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        elif self.gguf is not None:
            self.gguf.close()


def _bias_vector(bias: Mapping[int, float], n_vocab: int) -> torch.Tensor | None:
    if not bias:
        return None
    v = torch.zeros(n_vocab)
    for tid, b in bias.items():
        v[tid] = b
    return v


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
