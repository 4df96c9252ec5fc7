"""The prompt cache and its store. PromptCache (serve --prompt-cache): the token ids whose K/V rows the
live cache holds, so a request continues at the prefix its prompt shares with them. The prompt store
(serve --prompt-cache-mib): copies of the KV rows of the conversations the live
cache gave up, so clients taking turns (an IDE agent and a chat, two agent threads) each continue
their own prefix instead of running their whole prompt again (what llama.cpp server's slot
save/restore and vLLM's prefix caching give, here for one decode slot).

When: the live cache (PromptCache, below) is copied here just before a request overwrites rows it
claims (its prompt does not extend them all), so a single conversation's turns copy nothing, and the
copy holds what the last request left (claimed rows only: a failed forward claimed none, so it
stores nothing). A request then continues the longest prefix the live cache or a stored copy holds;
a stored one is copied back into the live cache first (only the rows past the prefix the two share).

What: the claimed positions' rows plus the sequence state of recurrent layers (kimi-k3's KDA,
deepseek4's compressor rings), which is exactly the state at the end of those positions: such a
copy continues only a prompt it is wholly a prefix of (PromptCache.reusable's rule for a cache that
cannot rewind), as the live cache does.

Where: on the cache's device, within a byte budget that the memory plan reserves (its
prompt_store term, next to the KV cache: device memory on a discrete GPU, host memory on the CPU
and on the DGX Spark's unified memory), least recently used out first. On a discrete GPU a device
copy restores at device bandwidth (~3 TB/s on the H200: well over 1000x faster than recomputing
the rows); a pinned host copy would restore at ~50 GB/s but leave the device memory to the experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from sparkd.engine.errors import EngineError

if TYPE_CHECKING:  # torch only for annotations: the CLI parses its flags before importing torch
    import torch

    from sparkd.engine.layers.kv_cache import KVCache

MIB = 1 << 20
# auto: 2 GiB, at most 1/16 of the memory budget. 2 GiB holds a few conversations' f32 rows of a
# big model (4096 positions: 0.56 GiB of deepseek-v3's MLA latents, 1.5 GiB of qwen3-30b-a3b's
# K/V) and is 1.7 % of the DGX Spark's 121 GiB; the share keeps small budgets' expert caches.
DEFAULT_BYTES = 2 << 30
BUDGET_SHARE = 1 / 16


def parse_store_mib(text: str) -> int | None:
    """--prompt-cache-mib: 'auto' -> None, else MiB (0 or more) -> bytes."""
    if text == "auto":
        return None
    try:
        mib = int(text)
    except ValueError:
        mib = -1
    if mib < 0:
        raise EngineError(f"could not use --prompt-cache-mib {text}: it takes MiB (0 or more; 0: the live "
                          "cache only) or auto")
    return mib * MIB


def store_bytes(requested: int | None, budget_bytes: int | None, room: int | None = None) -> int:
    """The store's budget: requested (bytes), or auto's: DEFAULT_BYTES, at most BUDGET_SHARE of a memory budget
    when there is one, and at most room, what the rest of the plan leaves (so a plan that fitted without the
    store still fits)."""
    if requested is not None:
        return requested
    auto = DEFAULT_BYTES if budget_bytes is None else min(DEFAULT_BYTES, int(budget_bytes * BUDGET_SHARE))
    return auto if room is None else max(0, min(auto, room))


def common_prefix(a: Sequence[int], b: Sequence[int], chunk: int = 256) -> int:
    """The length of a's and b's common prefix: compared a chunk at a time as lists (in C), token by token only
    inside the first chunk that differs (a Python loop over every token of every stored conversation cost each
    request about a millisecond at a few thousand tokens)."""
    n, i = min(len(a), len(b)), 0
    while i < n:
        j = min(i + chunk, n)
        if list(a[i:j]) != list(b[i:j]):
            return next(k for k in range(i, j) if a[k] != b[k])
        i = j
    return n


class PromptCache:
    """The token ids whose K/V rows the engine's cache holds (positions 0..n-1: the last request's
    prompt and the tokens it fed, as far as they were written), so the next request continues at
    the common prefix instead of running its whole prompt again (llama.cpp's cache_prompt).

    Only rows written by a step or a prompt chunk that finished are claimed: begin() drops the claim
    while rows are being written and written() gives it back with the new ids, so an error or a
    cancel in a forward leaves nothing claimed and the next request starts from an empty, reset cache.
    The logits of the last prompt's last token are kept too: the same prompt again (a repeated
    request) reuses every row and those logits, so it gives the same bits as the first time.

    A cache with recurrent state (KVCache.rewind_limit 0: kimi-k3's KDA, deepseek4's compressor
    rings) cannot go back to a shorter prefix: it is reused only when everything it holds is a
    prefix of the new prompt; one whose sliding-window rows are rings (gpt-oss, Gemma 3) goes back at
    most its rewind_limit positions."""

    def __init__(self) -> None:
        self.tokens: list[int] | None = None  # None: nothing claimed (the next request resets the cache)
        self.prompt: list[int] = []  # the prompt whose last token gave `logits`
        self.logits: torch.Tensor | None = None

    def reusable(self, ids: Sequence[int], rewind_limit: int | None = None) -> int:
        """How many leading positions of prompt ids the cache can keep: the common prefix, at most
        len(ids) - 1 (the last token's logits are needed) unless those are kept (the same prompt
        again); 0 when that would go back more than rewind_limit positions (None: any) from what it holds."""
        held = self.tokens
        if not held or not ids:
            return 0
        common = common_prefix(held, ids)
        if common == len(ids) and not (self.logits is not None and self.prompt == list(ids)):
            common -= 1  # re-run the last token for its logits
        if rewind_limit is not None and len(held) - common > rewind_limit:
            return 0
        return common

    def begin(self, tokens: list[int]) -> list[int]:
        """Rows past `tokens` are about to be written: claim none until written() says they were."""
        self.tokens = None
        return tokens

    def written(self, tokens: list[int], new: Sequence[int], prompt: Sequence[int] | None = None,
                logits: torch.Tensor | None = None) -> None:
        """The rows of `new` after `tokens` are written; with prompt: the prompt that ends there and
        its last token's logits."""
        tokens.extend(new)
        self.tokens = tokens
        if prompt is not None:
            self.prompt, self.logits = list(prompt), None if logits is None else logits.clone()



@dataclass(eq=False)
class _Entry:
    held: PromptCache  # its token ids, prompt and that prompt's last logits
    saved: list[torch.Tensor]  # KVCache.snapshot(len(tokens))
    nbytes: int


class PromptStore:
    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: list[_Entry] = []  # least recently used first
        self.saves = self.restores = self.evictions = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries)

    def stats(self) -> dict[str, int]:
        return {"bytes": self.nbytes, "entries": len(self._entries), "saves": self.saves,
                "restores": self.restores, "evictions": self.evictions}

    def best(self, ids: Sequence[int], rewind_limit: int | None) -> tuple[_Entry | None, int]:
        """The stored conversation that holds the longest prefix of ids, and its length (reusable's)."""
        best, most = None, 0
        for e in self._entries:
            n = e.held.reusable(ids, rewind_limit)
            if n > most:
                best, most = e, n
        return best, most

    def save(self, cache: KVCache, held: PromptCache) -> None:
        """Copy the rows held claims (and the cache's sequence state) unless they do not fit the budget;
        evicts least recently used copies for room, and drops those the new one covers."""
        tokens = held.tokens
        if not tokens:
            return
        same = next((e for e in self._entries if e.held.tokens == tokens), None)
        if same is not None:  # the same positions' rows: already here
            self._touch(same)
            return
        logits = held.logits
        nbytes = cache.prefix_bytes(len(tokens)) + (0 if logits is None else logits.nbytes)
        if nbytes > self.budget_bytes:
            return
        limit = cache.rewind_limit  # a stored prefix of these tokens this copy can go back to continues nothing more
        self._entries = [e for e in self._entries if e.held.tokens != tokens[:len(e.held.tokens)]
                         or (limit is not None and len(tokens) - len(e.held.tokens) > limit)]
        while self._entries and self.nbytes + nbytes > self.budget_bytes:
            self._entries.pop(0)
            self.evictions += 1
        copy = PromptCache()
        copy.tokens, copy.prompt, copy.logits = list(tokens), held.prompt, logits  # logits are replaced, never written
        self._entries.append(_Entry(copy, cache.snapshot(len(tokens)), nbytes))
        self.saves += 1

    def restore(self, entry: _Entry, cache: KVCache, held: PromptCache, keep: int) -> None:
        """Make the live cache hold entry's first keep positions (held then claims nothing: the caller's
        begin() gives the claim)."""
        live = held.tokens or []
        cache.restore(entry.saved, min(keep, common_prefix(live, entry.held.tokens)), keep)
        held.begin([])
        held.prompt, held.logits = entry.held.prompt, entry.held.logits
        self._touch(entry)
        self.restores += 1

    def _touch(self, entry: _Entry) -> None:
        if entry in self._entries:  # save() may have dropped it: the live copy it came from covers it
            self._entries.remove(entry)
            self._entries.append(entry)
