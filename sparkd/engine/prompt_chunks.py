"""A resident model's prompt in chunks the memory left after the load holds.

A streaming model's plan reserves a workspace for batch_tokens, and its prompts run in chunks of that many
(streaming/plan.py). A resident model had no such term: its prompt ran whole, and a chunk's attention holds scores over
its tokens times the positions it reads, so a 100k-token prompt on a resident gpt-oss asked attend for [8, 100k, 100k]
scores (320 GB): an out-of-memory error on a discrete GPU, the service's cgroup limit on a DGX Spark.

After the load (and the graphs' captures), room_bytes measures what the process may still take, and reserved_workspace
is the workspace of the largest chunk a prompt filling the context could run in within it. Each prompt then runs
whole where its workspace at the positions it reaches fits that reserve, so short prompts keep their graphs
(prompt_graphs.py), and a long one runs in the largest power-of-two chunks that fit.
"""

from __future__ import annotations

from sparkd.engine.models.config import ModelConfig
from sparkd.engine.streaming.device import probe_device, vram_margin_bytes
from sparkd.engine.streaming.plan import resolve_budget, runtime_rss_bytes, workspace_bytes

MIN_CHUNK_TOKENS = 16  # as the streaming plan's smallest chunk (plan.default_batch_tokens)


def chunk_tokens(cfg: ModelConfig, start: int, n: int, room_bytes: int, cuda: bool = False) -> int:
    """How many of a prompt's n new tokens (after start cached positions) one forward takes: all n where their
    workspace at the prompt's last position fits room_bytes, else the largest power of two that does (at least
    MIN_CHUNK_TOKENS, or n where fewer)."""
    tokens = n
    while tokens > MIN_CHUNK_TOKENS and workspace_bytes(cfg, start + n, tokens, cuda) > room_bytes:
        tokens = 1 << ((tokens - 1).bit_length() - 1)  # the largest power of two below
    return max(1, tokens)  # (n = 0, a prompt the cache holds whole: still a step for range())


def reserved_workspace(cfg: ModelConfig, ctx: int, room_bytes: int, cuda: bool = False) -> tuple[int, int]:
    """(chunk tokens, workspace bytes) of a prompt filling all ctx positions in the largest chunks room_bytes holds:
    what a resident model keeps free for its prompts (its plan's workspace term). At least the smallest chunk's,
    room or not."""
    tokens = chunk_tokens(cfg, 0, ctx, room_bytes, cuda)
    return tokens, workspace_bytes(cfg, ctx, tokens, cuda)


def room_bytes(device: str, budget_bytes: int | None, held_bytes: int = 0) -> int:
    """What this process may still allocate now, less held_bytes (taken later: the prompt store's budget): on a CUDA
    device its free memory and what torch's allocator holds unused, less the margin a streaming plan keeps there
    (device.vram_margin_bytes); on the CPU the budget (--budget, else the cgroup's memory.max minus headroom) less this
    process's resident memory, else MemAvailable; on a device sharing host memory the smaller of the two."""
    budget = resolve_budget(budget_bytes)
    room = host = budget.bytes - (0 if budget.source == "MemAvailable" else runtime_rss_bytes())
    if device != "cpu":
        import torch

        info = probe_device(device)
        if info.total_bytes:  # else no memory of its own that torch reports
            d = torch.device(info.name)
            free = (info.free_bytes + torch.cuda.memory_reserved(d) - torch.cuda.memory_allocated(d)
                    - vram_margin_bytes(info))
            room = min(free, host) if info.kind == "integrated" else free
    return room - held_bytes
