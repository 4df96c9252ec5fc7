"""The memory plan: what the engine will hold, decided before any large allocation.

budget = --budget, else this process's cgroup memory limit minus headroom, else MemAvailable
(with a warning). The plan splits it into runtime (the interpreter and libraries already
loaded), the resident trunk (after dequantization), the KV cache for --ctx, a compute workspace,
prefetch slots and the expert cache (the rest, in whole slots). Too small for one layer's top-k
plus the prefetch slots → PlanError listing every term in bytes.

On a discrete GPU (streaming/device.py) trunk, KV cache and workspace are device terms and leave
the host budget; the host then holds the CUDA runtime, the buffer the trunk loads through
(staging), and the pinned arena; the device holds a VRAM expert cache as well.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from gguf.constants import GGMLQuantizationType as Q

from sparkd.engine.errors import EngineError
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.layers.kv_cache import KV_TYPES, ring_rows
from sparkd.engine.layers.qlinear import CHUNK_VALUES
from sparkd.engine.models.config import ModelConfig
from sparkd.engine.models.staging import staging_buffer_bytes
from sparkd.engine.models.weights import STACKED_WEIGHT, kernel_rule, resident_q8_0_layout
from sparkd.engine.prompt_store import store_bytes
from sparkd.engine.streaming.device import CPU, DeviceInfo, split_vram, vram_margin_bytes, wants_vram_cache

# A routed-expert weight tensor; its biases (gpt-oss) are small and stay resident with the trunk.
EXPERT_WEIGHT = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")
_LAYER = re.compile(r"^blk\.(\d+)\.")
ALIGN_BYTES = 4096  # O_DIRECT offset/length/buffer alignment (logical block ≤ page on NVMe)
# Headroom under a cgroup limit: the kernel charges some memory we cannot see ahead of time
# (socket buffers, page tables, slab); 5 % but at least 256 MiB keeps the OOM killer away.
HEADROOM_FRACTION = 0.05
HEADROOM_MIN_BYTES = 256 << 20
F32_BYTES = 4
# Memory no term models: reader thread stacks, allocator fragmentation, modules imported after the
# plan (tokenizer, sampler). Measured ~15 MiB on a 206 MiB test model (docs/performance.md).
SLACK_FRACTION = 0.02
SLACK_MIN_BYTES = 32 << 20
WORKSPACE_SHARE = 1 / 32  # of the budget, when --batch-tokens is not given


class PlanError(EngineError):
    """The budget cannot hold the model's minimum; the message lists each term in bytes."""


@dataclass(frozen=True)
class Budget:
    bytes: int
    source: str  # "--budget", "cgroup <path>" or "MemAvailable"
    warning: str = ""


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: int
    budget_source: str
    runtime_bytes: int  # this process before the model: interpreter, torch, libraries
    slack_bytes: int  # threads, allocator fragmentation, late imports
    trunk_bytes: int  # resident tensors: quantized matrices as in the file, the rest f32
    kv_bytes: int
    workspace_bytes: int
    slot_bytes: int  # one expert's gate+up+down, each 4 KiB-bracketed
    cache_slots: int
    prefetch_slots: int
    min_slots: int  # top-k of one layer
    n_experts_total: int  # routed experts in the model (layers x experts)
    ctx: int
    batch_tokens: int
    device_name: str = "cpu"
    device_kind: str = "cpu"  # "cpu", "discrete" or "integrated"
    cuda_runtime_bytes: int = 0  # host memory CUDA took when set up (in the host budget)
    staging_bytes: int = 0  # host buffer the trunk loads through onto a GPU (models/staging.py)
    device_free_bytes: int = 0  # free device memory before the trunk was loaded
    vram_margin_bytes: int = 0
    vram_slots: int = 0  # VRAM expert cache, slots of slot_bytes
    vram_budget_source: str = ""
    prompt_store_bytes: int = 0  # copies of given-up conversations' KV rows (prompt_store.py), beside the KV cache
    prompt_rule_bytes: int = 0  # of workspace_bytes: a prompt's recurrent rule at its peak (Kimi K3's KDA)
    kv_type: str = "f32"  # the attention layers' K/V rows (--kv-type, resolved: layers/kv_cache.KV_TYPES)
    rope_bytes: int = 0  # the rope tables of every position up to ctx (rope_bytes), shared by the caches

    @property
    def trunk_on_device(self) -> bool:
        """A discrete GPU holds trunk, KV cache and workspace: they leave the host budget."""
        return self.device_kind == "discrete"

    @property
    def expert_cache_bytes(self) -> int:
        return self.cache_slots * self.slot_bytes

    @property
    def prefetch_bytes(self) -> int:
        return self.prefetch_slots * self.slot_bytes

    @property
    def vram_cache_bytes(self) -> int:
        return self.vram_slots * self.slot_bytes

    @property
    def model_bytes(self) -> int:
        """Trunk, KV cache, rope tables, workspace and prompt store: the device's on a discrete GPU, else the host's."""
        return self.trunk_bytes + self.kv_bytes + self.rope_bytes + self.workspace_bytes + self.prompt_store_bytes

    @property
    def host_model_bytes(self) -> int:
        """model_bytes as far as they are host memory."""
        return 0 if self.trunk_on_device else self.model_bytes

    @property
    def total_bytes(self) -> int:
        """Host memory: what the budget must hold."""
        return (self.runtime_bytes + self.cuda_runtime_bytes + self.slack_bytes + self.staging_bytes
                + self.host_model_bytes + self.expert_cache_bytes + self.prefetch_bytes)

    @property
    def device_total_bytes(self) -> int:
        if not self.trunk_on_device:
            return 0
        return self.model_bytes + self.vram_cache_bytes

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(expert_cache_bytes=self.expert_cache_bytes, prefetch_bytes=self.prefetch_bytes,
                 total_bytes=self.total_bytes, vram_cache_bytes=self.vram_cache_bytes,
                 device_total_bytes=self.device_total_bytes, trunk_on_device=self.trunk_on_device)
        return d

    def describe(self) -> str:
        share = f"of {self.n_experts_total} experts"
        trunk = ("resident weights, matrices kept quantized" if self.device_kind == "cpu"
                 else "kernel projections as quant blocks, the rest f32")
        model = [("trunk", self.trunk_bytes, trunk),
                 ("kv cache", self.kv_bytes, f"ctx {self.ctx}, {self.kv_type} rows"),
                 ("rope tables", self.rope_bytes, f"cos and sin of {self.ctx} positions"),
                 ("workspace", self.workspace_bytes, f"batch of {self.batch_tokens} tokens"
                  + (f", {_human(self.prompt_rule_bytes)} of it the KDA delta rule" if self.prompt_rule_bytes else ""))]
        if self.prompt_store_bytes:
            model.append(("prompt store", self.prompt_store_bytes, "given-up conversations' KV rows, at most"))
        host = [("budget", self.budget_bytes, self.budget_source),
                ("runtime", self.runtime_bytes, "interpreter and libraries"),
                ("cuda runtime", self.cuda_runtime_bytes, "host memory of the CUDA runtime"),
                ("slack", self.slack_bytes, "threads, allocator, late imports"),
                ("staging", self.staging_bytes, "host buffer the trunk loads through, freed after")]
        host += [] if self.trunk_on_device else model
        host += [("prefetch", self.prefetch_bytes, f"{self.prefetch_slots} slots"),
                 ("expert cache", self.expert_cache_bytes,
                  f"{self.cache_slots} slots of {self.slot_bytes} bytes "
                  f"({self.cache_slots / max(1, self.n_experts_total):.1%} {share}), "
                  + ("pinned arena" if self.device_kind != "cpu" else "arena")),
                 ("total", self.total_bytes, "")]
        host = [r for r in host if r[1] or r[0] in ("budget", "total", "expert cache")]
        text = f"  host ({self.device_name if self.device_kind == 'cpu' else 'CPU memory'}):\n" + _rows(host)
        if not self.trunk_on_device:
            return text
        device = [("free", self.device_free_bytes, "before the trunk was loaded"), *model,
                  ("margin", self.vram_margin_bytes, "allocator, compiled kernels, cuBLAS"),
                  ("vram experts", self.vram_cache_bytes,
                   f"{self.vram_slots} slots ({self.vram_slots / max(1, self.n_experts_total):.1%} {share}): "
                   f"{self.vram_budget_source}"),
                  ("total", self.device_total_bytes, "")]
        return text + f"\n  device ({self.device_name}, discrete):\n" + _rows(device)


def _rows(rows: list[tuple[str, int, str]]) -> str:
    return "\n".join(f"    {name:13s} {n:>16,d} bytes  {_human(n):>10s}  {why}" for name, n, why in rows)


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


# --- the budget ----------------------------------------------------------------------------------
def cgroup_limit_bytes(proc_self_cgroup: str | Path = "/proc/self/cgroup",
                       cgroup2_root: str | Path = "/sys/fs/cgroup") -> tuple[int, Path] | None:
    """The tightest memory.max on this process's cgroup v2 path (its own or an ancestor's)."""
    try:
        lines = Path(proc_self_cgroup).read_text().splitlines()
    except OSError:
        return None
    rel = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    if rel is None:
        return None
    best: tuple[int, Path] | None = None
    d = Path(cgroup2_root) / rel.lstrip("/")
    root = Path(cgroup2_root)
    while True:
        f = d / "memory.max"
        try:
            text = f.read_text().strip()
        except OSError:
            text = "max"
        if text != "max" and text.isdigit() and (best is None or int(text) < best[0]):
            best = (int(text), f)
        if d == root or root not in d.parents:
            return best
        d = d.parent


def mem_available_bytes(meminfo: str | Path = "/proc/meminfo") -> int:
    for line in Path(meminfo).read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise EngineError(f"could not read MemAvailable from {meminfo}: the line is missing")


def resolve_budget(explicit_bytes: int | None, proc_self_cgroup: str | Path = "/proc/self/cgroup",
                   cgroup2_root: str | Path = "/sys/fs/cgroup",
                   meminfo: str | Path = "/proc/meminfo") -> Budget:
    if explicit_bytes is not None:
        return Budget(explicit_bytes, "--budget")
    limit = cgroup_limit_bytes(proc_self_cgroup, cgroup2_root)
    if limit is not None:
        n, path = limit
        headroom = max(HEADROOM_MIN_BYTES, int(n * HEADROOM_FRACTION))
        return Budget(max(0, n - headroom), f"cgroup {path} = {n} minus {headroom} headroom")
    avail = mem_available_bytes(meminfo)
    return Budget(avail, "MemAvailable", warning=(
        f"no --budget and no cgroup memory.max above this process: using MemAvailable "
        f"({avail} bytes), which other processes share; pass --budget or run under sparkd"))


def runtime_rss_bytes(status: str | Path = "/proc/self/status") -> int:
    for line in Path(status).read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


# --- the terms ---------------------------------------------------------------------------------
def bracket_bytes(offset: int, nbytes: int) -> tuple[int, int]:
    """(aligned start, aligned length) covering [offset, offset + nbytes) in ALIGN_BYTES units."""
    start = offset - offset % ALIGN_BYTES
    end = -(-(offset + nbytes) // ALIGN_BYTES) * ALIGN_BYTES
    return start, end - start


def expert_slot_bytes(g: GGUFModel) -> int:
    """Bytes one slot needs for the worst expert of any layer: gate+up+down, each bracketed."""
    per_layer: dict[int, int] = {}
    for name, info in g.tensors.items():
        m = EXPERT_WEIGHT.match(name)
        if m:
            per_slice = info.nbytes // info.shape[0]
            worst = max(bracket_bytes(info.offset + e * per_slice, per_slice)[1]
                        for e in range(info.shape[0]))
            per_layer[int(m[1])] = per_layer.get(int(m[1]), 0) + worst
    return max(per_layer.values(), default=0)


def trunk_bytes(g: GGUFModel, n_layer: int | None = None,
                multiplies: Callable[[Q, int], bool] | None = None) -> int:
    """Resident non-expert tensors as the loader holds them. Blocks past n_layer (NextN/MTP draft
    heads, never loaded) do not count.

    On the CPU (multiplies None) a streamed model keeps 2-D quantized weights as their file
    bytes (QuantLinear; Q8_0 with f32 scales), everything else f32, plus the buffer they dequantize
    into. On a GPU (multiplies: dispatch.multiplies, whether a Triton kernel multiplies a type's rows of that width)
    2-D weights the kernels multiply stay raw file bytes (KernelLinear; F16 and BF16 too since session 36), and so do
    MLA's 3-D per-head matrices (STACKED_WEIGHT) and, since session 35, the token embedding (KernelEmbedding; f32
    before: a 151936 x 2048 vocabulary 1.2 GiB, not its 0.33 GiB of Q8_0); everything else is f32."""
    gpu = multiplies is not None
    total = 0 if gpu else CHUNK_VALUES * F32_BYTES
    for name, info in g.tensors.items():
        layer = _LAYER.match(name)
        if EXPERT_WEIGHT.match(name) or (n_layer is not None and layer is not None and int(layer[1]) >= n_layer):
            continue
        blocks = gpu and multiplies(info.ggml_type, info.shape[-1])  # (Weights.kept_as_blocks' rule)
        if gpu and (STACKED_WEIGHT.fullmatch(name) or name == "token_embd.weight"):
            # Weights.stacked's and Weights.embedding's: the file's layout
            total += info.nbytes if blocks else info.n_elements * F32_BYTES
        elif gpu:
            total += _device_raw_bytes(info) if blocks and len(info.shape) == 2 else info.n_elements * F32_BYTES
        elif len(info.shape) != 2 or info.ggml_type in (Q.F32, Q.F64):
            total += info.n_elements * F32_BYTES
        elif info.ggml_type == Q.Q8_0:  # int8 quants and f32 scales held apart (QuantRows)
            total += info.n_elements + info.n_elements // 32 * F32_BYTES
        else:
            total += info.nbytes
    return total


def resident_bytes(g: GGUFModel, n_layer: int,
                   multiplies: Callable[[Q, int], bool] | None = None) -> tuple[int, int]:
    """(trunk, routed experts) of a model loaded whole (--resident, a dense model), as the loader holds them: on the
    CPU (multiplies None) every tensor f32 (Weights dequantizes them); on a GPU (multiplies: dispatch.multiplies) the
    trunk as trunk_bytes counts it and the routed experts the kernels multiply as their file bytes (KernelExperts),
    f32 the rest. Before session 39 the GPU's count was the CPU's: a 27B dense Q4_K model 108 GB of f32 where the
    device holds ~17 GB, so a --budget the supervisor passes refused it."""
    experts = sum(info.nbytes if multiplies is not None and multiplies(info.ggml_type, info.shape[-1])
                  else info.n_elements * F32_BYTES for name, info in g.tensors.items() if EXPERT_WEIGHT.match(name))
    if multiplies is not None:
        return trunk_bytes(g, n_layer, multiplies), experts
    trunk = sum(info.n_elements * F32_BYTES for name, info in g.tensors.items() if not EXPERT_WEIGHT.match(name))
    return trunk, experts


def _device_raw_bytes(info) -> int:
    """A kernel projection's bytes on the device: its file bytes, or whole 272-byte groups per
    row in the packed Q8_0 layout (Weights.linear repacks resident Q8_0 projections)."""
    if info.ggml_type != Q.Q8_0 or resident_q8_0_layout() != "packed":
        return info.nbytes
    from sparkd.engine.kernels.q8_0_packed import row_bytes  # imports triton: a GPU's plan only

    rows, cols = info.shape
    return rows * row_bytes(cols)


def largest_trunk_tensor_bytes(g: GGUFModel) -> int:
    """File bytes of the largest tensor that is not a routed-expert weight: what one read of the
    loader can need (its staging buffer is never larger)."""
    return max((t.nbytes for n, t in g.tensors.items() if not EXPERT_WEIGHT.match(n)), default=0)


def staging_term_bytes(g: GGUFModel, device: DeviceInfo) -> int:
    """Host memory the trunk load holds beyond the plan's other terms. On the CPU none: tensors
    are built where they stay. On a GPU the loader reads each trunk tensor chunk by chunk through
    one two-half buffer (min(16 MiB, the largest trunk tensor) a half) straight into device memory
    and dequantizes it there; nothing else of the trunk is on the host at once, so the buffer is
    the term. (Building on the host and moving the network after held the whole trunk, f32 where
    dequantized: 1.2-1.5 GB over the steady state for a 0.75 GB trunk on the H200.)"""
    return 0 if device.kind == "cpu" else staging_buffer_bytes(largest_trunk_tensor_bytes(g))


def kv_bytes(cfg: ModelConfig, ctx: int, kv_type: str = "f32") -> int:
    """One sequence's cache: per-position K/V, plus recurrent state where an architecture module
    says so through cache_bytes(cfg, ctx, kv_type) (Kimi K3: MLA latent + KDA conv and delta-rule state;
    DeepSeek V4: each layer's window of raw rows plus compressor state). kv_type: the K/V rows of GQA layers and MLA's
    latent rows, Kimi K3's too since session 36 (KVCache's kv_dtype); DeepSeek V4's rows, side rows and recurrent
    state stay float32."""
    from sparkd.engine.models import arch_module  # here: models imports this module's regex

    own = getattr(arch_module(cfg.arch), "cache_bytes", None)
    if own is not None:
        return own(cfg, ctx, kv_type)
    side = cfg.extra.get("side_cache_floats_per_pos", 0) * F32_BYTES  # e.g. glm-dsa's indexer keys, all layers
    if cfg.kv_lora_rank:  # MLA caches the latent plus the rope key, no values
        return ((cfg.kv_lora_rank + cfg.rope.n_rot) * KV_TYPES[kv_type].itemsize * cfg.n_layer + side) * ctx
    per_pos = cfg.n_head_kv * (cfg.head_dim_k + cfg.head_dim_v) * KV_TYPES[kv_type].itemsize
    rows = sum(ring_rows(cfg.n_swa if cfg.is_swa_layer(il) else 0, ctx) or ctx for il in range(cfg.n_layer))
    return per_pos * rows + side * ctx  # a sliding-window layer's rows are a ring (KVCache.ring)


# Without --ctx the KV cache covers this many positions (or the model's training context if smaller): a model's full
# training context (40k-160k) would cost GBs of KV it rarely uses.
DEFAULT_CTX = 4096


def context_for(requested: int | None, n_ctx_train: int) -> int:
    """The positions a sequence's cache holds for --ctx `requested` (None: DEFAULT_CTX, at most the trained context),
    as serve, generate and plan take it; EngineError for a context the model was not trained for."""
    if requested is None:
        return min(DEFAULT_CTX, n_ctx_train)
    if requested < 1:
        raise EngineError(f"could not use --ctx {requested}: it must be at least 1")
    if requested > n_ctx_train:
        raise EngineError(f"could not use --ctx {requested}: the model was trained for {n_ctx_train} positions; "
                          f"give --ctx {n_ctx_train} or less")
    return requested


def rope_bytes(cfg: ModelConfig, ctx: int) -> int:
    """The rope tables the caches share (KVCache.rope_table): cos and sin [ctx, n_rot/2] float32 for each rope the
    layers take (cfg.rope, Gemma 3's windowed layers' rope_swa, or what an architecture module lists: DeepSeek V4's
    two). DeepSeek V4 Flash at 1M positions: 0.54 GB; a Gemma 3 27B-like shape at 131072: 0.13 GB."""
    from sparkd.engine.models import arch_module  # here: models imports this module's regex

    own = getattr(arch_module(cfg.arch), "rope_configs", None)
    ropes = set(own(cfg)) if own is not None else {r for r in (cfg.rope, cfg.rope_swa) if r is not None}
    return sum(2 * ctx * (r.n_rot // 2) * F32_BYTES for r in ropes)


def cache_kv_type(cfg: ModelConfig, kv_type: str) -> str:
    """The type a sequence's cache rows take for --kv-type kv_type (resolved): kv_type, or f32 where the architecture's
    cache takes none (its module's KV_TYPED False: DeepSeek V4, whose windows of raw rows and compressor state stay
    f32), so the plan, `generate --json` and the server's /health name the type the rows have."""
    from sparkd.engine.models import arch_module  # here: models imports this module's regex

    return kv_type if getattr(arch_module(cfg.arch), "KV_TYPED", True) else "f32"


def prompt_rule_bytes(cfg: ModelConfig, batch_tokens: int, cuda: bool) -> int:
    """A prompt's recurrent rule at its peak, where an architecture module counts one (Kimi K3: the KDA delta rule,
    in chunks on CUDA, layers/kda.py rule_peak_bytes), counted exactly."""
    from sparkd.engine.models import arch_module  # here: models imports this module's regex

    own = getattr(arch_module(cfg.arch), "prompt_rule_bytes", None)
    return own(cfg, batch_tokens, cuda) if own is not None else 0


def attention_floats(cfg: ModelConfig, ctx: int, T: int, cuda: bool = False) -> int:
    """A prompt chunk of T tokens' largest attention transient in one layer at up to ctx positions, in floats:
    scores, mask and probabilities over every position for the heads attend computes at once (session 38: GQA one
    query head of each group at a time, [Hkv, T, ctx]; MQA, MLA's latent head, MQA_HEADS heads at a time) and GQA's
    rows widened (widened_floats: attend reads each KV head in place for its query heads, session 38).
    On CUDA (session 39) a chunk SDPA runs holds no scores:
    - GQA from CONTINUE_SDPA_ROWS tokens (attention.continue_sdpa) reads the keys and values broadcast over each
      group (stride 0, session 40: no rows repeated) and holds the queries' contiguous copy and the output's
      (2 [T, H, D]); with sinks (PROMPT_SINKS, session 41) also with_sink_key's copies of the queries, keys and
      values (one key more, SINK_DIMS wider) and a second mask (the sink's column added);
    - MLA from MHA_ROWS its heads' keys and values expanded from the latent rows, EXPAND_HEADS heads at a time
      (layers/mla.py);
    both a boolean [T, ctx] mask at most (a window's). A prompt's last chunk may be shorter and run attend, so the
    count is the larger of SDPA's and attend's scores over one row fewer than SDPA's threshold.
    tests/engine/test_attention_memory.py measures every tensor a forward makes against this (on the GPU box the
    device's peak)."""
    from sparkd.engine.layers.attention import (CONTINUE_SDPA_ROWS, MQA_HEADS, SINK_DIMS,  # here: layers are the
                                                continue_sdpa)  # model code's, not the plan's imports
    from sparkd.engine.layers.mla import EXPAND_HEADS, MHA_ROWS, MLA_PROMPT
    from sparkd.engine.models import arch_module

    H, Hkv = cfg.n_head, cfg.n_head_kv
    module = arch_module(cfg.arch)
    at_once = min(H, MQA_HEADS) if cfg.kv_lora_rank or Hkv <= 1 else Hkv  # a score tensor's heads
    sdpa = cuda and not getattr(module, "PROMPT_SCORES", False)  # a key selector: attend
    if cfg.kv_lora_rank:
        sdpa, below = sdpa and MLA_PROMPT == "mha" and T >= MHA_ROWS, MHA_ROWS
        rows = 2 * ctx * min(H, EXPAND_HEADS) * (cfg.head_dim_k_mla + cfg.head_dim_v)  # one head block's k and v
    else:
        sdpa, below = sdpa and continue_sdpa(T), CONTINUE_SDPA_ROWS
        rows = 2 * T * H * max(cfg.head_dim_k, cfg.head_dim_v)  # the queries' and the output's copies
        if getattr(module, "PROMPT_SINKS", False):
            wide = cfg.head_dim_k + SINK_DIMS
            rows += T * H * wide + (ctx + 1) * Hkv * (wide + cfg.head_dim_v) + T * (ctx + 1) // 4  # its mask
    widened = widened_floats(cfg, ctx, cuda)
    if not sdpa:
        return 3 * at_once * T * ctx + widened
    return max(3 * at_once * min(T, below - 1) * ctx, rows + T * ctx // 4) + widened


def widened_floats(cfg: ModelConfig, ctx: int, cuda: bool = False) -> int:
    """GQA's part of attention_floats that any prompt chunk at ctx positions holds, whatever its tokens: the float16
    rows widened to float32 ([ctx, Hkv, D] twice; three times on CUDA, where attend's products copy the permuted
    rows: 18.4 MB at 3000 x 8 x 64 on the H100, session 39)."""
    if cfg.kv_lora_rank:
        return 0
    return (3 if cuda else 2) * cfg.n_head_kv * ctx * max(cfg.head_dim_k, cfg.head_dim_v)


def workspace_bytes(cfg: ModelConfig, ctx: int, batch_tokens: int, cuda: bool = False) -> int:
    """Peak transient tensors of one forward pass over batch_tokens (f32), with 50 % slack, plus a prompt's
    recurrent rule (prompt_rule_bytes; on cuda where the model runs there). The attention's: attention_floats, or
    what an architecture module counts (attention_floats(cfg, ctx, T): DeepSeek V4, session 36, whose scores span a
    window and its compressed entries)."""
    from sparkd.engine.models import arch_module  # here: models imports this module's regex

    T, D, A = batch_tokens, cfg.n_embd, max(1, cfg.n_expert_used)
    own = getattr(arch_module(cfg.arch), "attention_floats", None)
    scores = own(cfg, ctx, T) if own is not None else attention_floats(cfg, ctx, T, cuda)
    heads = cfg.n_head * max(cfg.head_dim_k, cfg.head_dim_k_mla, 1)
    dense = 3 * T * cfg.n_ff if cfg.n_layer_dense_lead or not cfg.is_moe else 0  # gate, up, activation
    moe = 3 * T * cfg.n_ff_exp + T * A * D + 3 * cfg.n_ff_exp * D  # one expert's g/u/act, outputs, weights
    values = (T * cfg.n_vocab  # logits
              + 8 * T * D + 4 * T * heads  # residual, norms, q/k/v/o
              + scores
              + max(dense, moe))
    return int(values * F32_BYTES * 1.5) + prompt_rule_bytes(cfg, batch_tokens, cuda) + slab_experts_bytes(cfg, T, cuda)


def slab_experts_bytes(cfg: ModelConfig, batch_tokens: int, cuda: bool = False) -> int:
    """What a MoE layer's slab experts (moe_prefill, session 47) hold beside the grouped GEMMs' tensors, where a prompt
    of batch_tokens takes them (CUDA, from layers.moe.slab_expert_rows rows an expert, this process's GPU's: session
    48, a GB10 loops torch._grouped_mm and takes them from more rows): the 16-bit values of the experts they
    dequantize at a time (EXPERT_SLAB_BYTES at most), and the routed rows' 16-bit x, gate | up and activations."""
    from sparkd.engine.kernels import EXPERT_SLAB_BYTES  # model code's, not the plan's imports
    from sparkd.engine.layers.moe import slab_expert_rows

    least = slab_expert_rows("cuda") if cuda and cfg.n_expert else None
    rows, D, F = batch_tokens * cfg.n_expert_used, cfg.n_embd, cfg.n_ff_exp
    if least is None or rows < least * cfg.n_expert:
        return 0
    return min(EXPERT_SLAB_BYTES, cfg.n_expert * 3 * F * D * 2) + rows * (D + 3 * F) * 2


def default_batch_tokens(cfg: ModelConfig, ctx: int, budget_bytes: int, cuda: bool = False) -> int:
    """The largest prompt chunk (512 down to 16 tokens, at most ctx) whose workspace takes at most
    WORKSPACE_SHARE of the budget: decode needs one token, and a 512-token workspace (1.7 GiB on
    the GPU box's 8 GiB budget) would starve the expert cache; prefill then runs in chunks. What every chunk at ctx
    holds whatever its size (widened_floats) is left out of the share: a smaller chunk would not save it."""
    from sparkd.engine.models import arch_module  # here: models imports this module's regex

    tokens = min(ctx, 512)
    own = getattr(arch_module(cfg.arch), "attention_floats", None)
    fixed = 0 if own is not None else int(widened_floats(cfg, ctx, cuda) * F32_BYTES * 1.5)  # no chunk trades it
    while tokens > 16 and workspace_bytes(cfg, ctx, tokens, cuda) - fixed > budget_bytes * WORKSPACE_SHARE:
        tokens //= 2
    return tokens


def make_plan(g: GGUFModel, cfg: ModelConfig, budget: Budget, ctx: int, prefetch_slots: int = 0,
              batch_tokens: int = 0, runtime_bytes: int | None = None,
              rss: Callable[[], int] = runtime_rss_bytes, device: DeviceInfo = CPU, unified: str = "auto",
              vram_budget_bytes: int | None = None, cuda_runtime_bytes: int = 0,
              prompt_store_bytes: int | None = 0, kv_type: str = "f32") -> MemoryPlan:
    """Split the budget (and a discrete GPU's memory); raise PlanError if the host budget cannot
    hold top-k experts plus prefetch slots, EngineError for a VRAM budget that cannot be used.
    prompt_store_bytes: the prompt store's budget (None: auto, prompt_store.store_bytes); kv_type: the K/V
    rows' type, resolved (kv_bytes)."""
    ctx = ctx or cfg.n_ctx_train
    kv_type = cache_kv_type(cfg, kv_type)
    cuda = device.kind != "cpu"
    batch_tokens = batch_tokens or default_batch_tokens(cfg, ctx, budget.bytes, cuda)
    n_moe = sum(cfg.is_moe_layer(il) for il in range(cfg.n_layer))
    total_experts = n_moe * cfg.n_expert
    slot = expert_slot_bytes(g)
    kernels = None if device.kind == "cpu" else kernel_rule()
    model = dict(trunk_bytes=trunk_bytes(g, cfg.n_layer, kernels), kv_bytes=kv_bytes(cfg, ctx, kv_type),
                 rope_bytes=rope_bytes(cfg, ctx), workspace_bytes=workspace_bytes(cfg, ctx, batch_tokens, cuda))
    host = dict(runtime_bytes=rss() if runtime_bytes is None else runtime_bytes,
                cuda_runtime_bytes=cuda_runtime_bytes,
                slack_bytes=max(SLACK_MIN_BYTES, int(budget.bytes * SLACK_FRACTION)),
                staging_bytes=staging_term_bytes(g, device))
    min_slots = cfg.n_expert_used if total_experts else 0
    if device.discrete:  # the room auto's store may take (store_bytes): the device's, else the host budget's
        room = device.free_bytes - vram_margin_bytes(device) - sum(model.values())
    else:
        room = budget.bytes - sum(host.values()) - sum(model.values()) - (prefetch_slots + min_slots) * slot
    model["prompt_store_bytes"] = store_bytes(prompt_store_bytes, budget.bytes, room)
    vram = split_vram(device, wants_vram_cache(device, unified), sum(model.values()), slot, total_experts,
                      vram_budget_bytes)
    terms = host | ({} if device.discrete else model)
    fixed = sum(terms.values()) + prefetch_slots * slot
    slots = min(total_experts, (budget.bytes - fixed) // slot) if slot else 0
    plan = MemoryPlan(budget.bytes, budget.source, slot_bytes=slot, cache_slots=max(0, slots),
                      prefetch_slots=prefetch_slots, min_slots=min_slots,
                      n_experts_total=total_experts, ctx=ctx, batch_tokens=batch_tokens, **host, **model,
                      prompt_rule_bytes=prompt_rule_bytes(cfg, batch_tokens, cuda), kv_type=kv_type,
                      device_name=device.name, device_kind=device.kind, device_free_bytes=device.free_bytes,
                      vram_margin_bytes=vram.margin_bytes, vram_slots=vram.slots, vram_budget_source=vram.source)
    if slots < min_slots:
        need = fixed + min_slots * slot
        raise PlanError(
            f"could not fit the model in a budget of {budget.bytes} bytes ({budget.source}): it needs "
            f"at least {need} bytes for one layer's top-{min_slots} experts plus "
            f"{prefetch_slots} prefetch slots:\n"
            + "\n".join(f"  {k[:-6]:10s} {v:>16,d} bytes" for k, v in terms.items())
            + f"\n  prefetch   {prefetch_slots * slot:>16,d} bytes ({prefetch_slots} x {slot})"
            + f"\n  experts    {min_slots * slot:>16,d} bytes (top-{min_slots} x {slot})"
            + "\nraise --budget, lower --ctx, or use fewer --prefetch slots")
    return plan

