"""Open a model for streaming: budget → plan → arena and store → trunk, in that order, so nothing
large is allocated before the plan says it fits. The server's runtime and the CLI both use this."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.layers.kv_cache import kv_type_name
from sparkd.engine.models import LoadedModel, Progress, config_of, load_model
from sparkd.engine.streaming.device import probe_device
from sparkd.engine.streaming.plan import Budget, MemoryPlan, context_for, make_plan, resolve_budget, runtime_rss_bytes
from sparkd.engine.streaming.policies import DEFAULT_POLICY
from sparkd.engine.streaming.prefetch import attach_prefetch
from sparkd.engine.streaming.store import StreamingExperts
from sparkd.engine.streaming.trace import read_census, trace_header
from sparkd.engine.streaming.vram import DEFAULT_MAX_PENDING, VramExperts
from sparkd.engine.streaming.zero_copy import table_mode


@dataclass
class StreamOptions:
    budget_bytes: int | None = None  # None: cgroup memory.max minus headroom, else MemAvailable
    ctx: int | None = None  # plan.context_for: None is DEFAULT_CTX at most the trained context
    batch_tokens: int = 0  # 0: plan.default_batch_tokens
    policy: str = DEFAULT_POLICY
    prefetch_slots: int = 0
    threads: int = 8
    direct: bool = True
    pin: bool = False  # pinned host memory for the arena (CUDA)
    device: str = "cpu"  # "cuda": trunk on the GPU, experts from VRAM slots or the pinned arena
    unified: str = "auto"  # on: zero-copy only; off: a VRAM expert cache; auto: off on a discrete GPU
    vram_budget_bytes: int | None = None  # the VRAM expert cache (None: free device memory - margin)
    prompt_store_bytes: int | None = 0  # the prompt store's plan term (None: auto; Engine sets it)
    kv_type: str = "auto"  # the K/V rows (--kv-type; layers/kv_cache.kv_dtype resolves auto by the device)
    trace_path: str | None = None
    census_path: str | None = None
    proc_self_cgroup: str = "/proc/self/cgroup"
    cgroup2_root: str = "/sys/fs/cgroup"
    meminfo: str = "/proc/meminfo"


def plan_for(g: GGUFModel, opts: StreamOptions) -> tuple[Budget, MemoryPlan]:
    budget = resolve_budget(opts.budget_bytes, opts.proc_self_cgroup, opts.cgroup2_root, opts.meminfo)
    cfg = config_of(g)
    ctx = context_for(opts.ctx, cfg.n_ctx_train)
    before = runtime_rss_bytes()
    device = probe_device(opts.device)  # sets CUDA up: its host memory is a term of its own
    after = runtime_rss_bytes()
    return budget, make_plan(g, cfg, budget, ctx, opts.prefetch_slots, opts.batch_tokens, runtime_bytes=before,
                             device=device, unified=opts.unified, vram_budget_bytes=opts.vram_budget_bytes,
                             cuda_runtime_bytes=max(0, after - before), prompt_store_bytes=opts.prompt_store_bytes,
                             kv_type=kv_type_name(opts.kv_type, opts.device))


# glibc mallopt parameters: a fixed mmap threshold (else it rises to 32 MiB after the first large
# free, and freed tensors then stay in the heap as RSS the plan never counted) and few arenas
# (every reader thread would otherwise get its own 64 MiB arena).
_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8


def limit_allocator_slack(mmap_threshold_bytes: int = 1 << 20, arenas: int = 2) -> bool:
    """Make freed tensor memory go back to the kernel; False where libc is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold_bytes)
                    and libc.mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


@dataclass
class StreamingModel:
    model: LoadedModel
    store: StreamingExperts
    plan: MemoryPlan
    budget: Budget
    _trace: TextIO | None = None
    _hooks: list = field(default_factory=list)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self.store.close()
        self.model.close()
        if self._trace is not None:
            self._trace.close()


def open_streaming(path: str | Path, opts: StreamOptions,
                   on_plan: Callable[[Budget, MemoryPlan], None] | None = None,
                   warn: Callable[[str], None] | None = None,
                   progress: Progress | None = None) -> StreamingModel:
    limit_allocator_slack()
    g = GGUFModel.open(path)
    trace = store = None
    try:
        budget, plan = plan_for(g, opts)
        if on_plan:
            on_plan(budget, plan)
        trace = open(opts.trace_path, "w") if opts.trace_path else None
        gpu = opts.device != "cpu"
        store = StreamingExperts(g, plan, opts.policy, opts.threads, opts.direct, opts.pin or gpu, trace, warn)
        store.kernel_device = opts.device if gpu else None
        store.table_mode = table_mode()
        if trace is not None:
            first = next(il for il in range(config_of(g).n_layer) if f"blk.{il}.ffn_gate_exps.weight" in g.tensors)
            trace.write(trace_header(plan.slot_bytes, store.expert_bytes(first)))
        m = load_model(g, store, progress, device=opts.device)
        g.drop_page_cache()  # header and trunk were read buffered: not on top of the plan in a cgroup
        if plan.vram_slots:  # after the trunk: it is the one that must fit
            # each copy in flight pins its source arena slot: leave top-k slots unpinned
            store.vram = VramExperts(plan.vram_slots, plan.slot_bytes, opts.device,
                                     max_pending=min(DEFAULT_MAX_PENDING, plan.cache_slots - plan.min_slots))
        hooks = attach_prefetch(m.net, store) if opts.prefetch_slots else []
        if opts.census_path:
            store.warm_start(read_census(opts.census_path))
        return StreamingModel(m, store, plan, budget, trace, hooks)
    except BaseException:
        if store is not None:
            store.close()
        if trace is not None:
            trace.close()
        g.close()
        raise
