"""Temperature sampling where the logits are: the host Sampler's chain on the device, one int back.

The chain is the host's (sampler.py): logit bias, repetition penalty over the recent tokens, the
top-k / top-p / min-p filters on the ranked logits, temperature, a draw. Every parameter sits in a
device buffer and the recent tokens in a device ring, so the chain has fixed shapes and no host
sync: StaticDecode captures it as a CUDA graph per bucket on a request's first draw there and
every later request replays it.

Ways to run the chain ($SPARKD_DEVICE_SAMPLING): "torch" as ~30 torch ops over the whole
vocabulary (sort, cumsums, two softmaxes), and "fused" (the default on CUDA) in Triton launches
(kernels/sample_draw.py) on two paths: the candidates path (each block's 64 best tokens, then one
program ranks those, filters and draws) serves requests with 1 <= top_k <= CAP (64): only then do
the candidates hold every token the filters can keep; the full path (block sums of exp, then one
program inverts the CDF: no ranking at all) serves top_k 0 (or >= the vocabulary) with top_p 1,
min-p or not; the top-p path (the full draw over the top-p prefix, its last token found by a
select over the logits' bits in histogram stages, kernels/top_p_select.py: no sort) serves top_k 0
with top_p < 1. The rest (top_k above CAP) takes the torch chain, as do top_k 0 with top_p < 1
under "chain-top-p" (session 18's fused) and every top_k 0 under "capped" (session 15's fused:
the candidates path only).

The distribution equals the host Sampler's bit for bit on the same logits on the CPU (the same
torch ops in the same order; tests/engine/test_device_sampler.py), and within rounding on a GPU
(there the softmax is spelled out, see softmax()). The draw does not: the host's
torch.multinomial consumes its CPU generator, this one takes one uniform number from a device
generator (seeded from the request's seed) and inverts the cumulative distribution in ranked
order. So a seeded request gets other tokens, equally distributed, with the device path on:
$SPARKD_DEVICE_SAMPLING=0 brings the logits row back to the host Sampler as before. The fused
path's uniform comes from Philox (the request's seed, a draw counter) instead of the device
generator, so it too repeats a seed's tokens, other ones than the torch chain's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sparkd.engine import switches
from sparkd.engine.errors import EngineError
from sparkd.engine.sampler import SamplingParams

DEVICE_SAMPLING_ENV = "SPARKD_DEVICE_SAMPLING"
# The longest repetition window the ring holds (llama.cpp's default is 64); a request with a
# longer one samples on the host.
RING_TOKENS = 256


# The fused path's layout (kernels/sample_draw.DrawScratch): candidates kept per block, which is
# also the largest top_k it serves; tokens per block and blocks per middle merge (H200, session 7,
# docs/runs/2026-11-30-s7-final/sampling.json: a draw 37.3 us at 1024 x 16, 179.8 at 4096 x 1
# (148 programs sorting 1024 keys beat 38 sorting 4096), the torch chain 208.7)
CAP = 64
BLOCK_TOKENS = 1024
MERGE_BLOCKS = 16

MODES = ("fused", "chain-top-p", "capped", "torch", "off")
_ALIASES = {"1": "fused", "on": "fused", "0": "off"}


def device_sampling_default() -> str:
    """$SPARKD_DEVICE_SAMPLING: fused (1, on, or unset) draws temperature requests on the device
    with the Triton kernels where the parameters allow (path()), else with the torch chain;
    chain-top-p the same without the top-p path (top_k 0 with top_p < 1 on the torch chain); capped
    also without the full path (every top_k 0 on the torch chain); torch always with the torch chain;
    off (0) brings the logits row back for the host Sampler; anything else is refused."""
    value = switches.choice(DEVICE_SAMPLING_ENV, tuple(_ALIASES) + MODES, "fused")
    return _ALIASES.get(value, value)


def fusable(params: SamplingParams, cap: int = CAP) -> bool:
    """Whether the fused kernels can draw for these parameters: top_k in 1..cap (the candidates
    then hold every token the filters can keep)."""
    return 1 <= params.top_k <= cap


def full_drawable(params: SamplingParams, n_vocab: int) -> bool:
    """Whether the full kernels can draw for these parameters: every token a candidate (top_k 0
    or >= n_vocab) and no top-p (its threshold needs the ranked mass; min-p needs only the max)."""
    return (params.top_k == 0 or params.top_k >= n_vocab) and params.top_p >= 1.0


def top_p_drawable(params: SamplingParams, n_vocab: int) -> bool:
    """Whether the top-p kernels can draw for these parameters: every token ranked (top_k 0 or
    >= n_vocab) and a top-p cut (min-p or not)."""
    return (params.top_k == 0 or params.top_k >= n_vocab) and params.top_p < 1.0


def device_drawable(params: SamplingParams, ring_tokens: int = RING_TOKENS) -> bool:
    """Whether DeviceSampler can serve these parameters: a temperature draw (greedy keeps its own
    pick) whose repetition window fits the ring (or has no effect)."""
    return params.temperature > 0 and (not params.penalised or params.repetition_window <= ring_tokens)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """torch.softmax over one float64 row on the CPU (the host Sampler's op, so the tests compare
    bit for bit); on a GPU the same formula as separate ops: torch.softmax of a single row runs in
    one thread block, and its float64 exps over 151936 entries cost ~0.1 ms there. Equal within
    rounding (the sum adds in another order)."""
    if x.device.type == "cpu":
        return torch.softmax(x, dim=0)
    e = torch.exp(x - x.max())
    return e / e.sum()


class DeviceSampler:
    """The sampling chain over one row of logits on `device`, parameters in device buffers.

    begin(params, history, bias) sets a request up (one small copy each); step(token, logits) adds
    the token just fed to the recent-token ring and draws the next token id, a [1] long tensor on
    the device; push(token) and draw(logits) are its halves. probabilities(logits) is the
    distribution draw samples from. fused: requests that fusable() accepts take the candidates
    kernels, (full, unless False) those that full_drawable() accepts the full kernels and (top_p,
    unless False or full is; `self.select` its select's buffers, None where off or the vocabulary
    has 2**19 tokens or more) those that top_p_drawable() accepts the top-p kernels (`self.path`
    says which the current one takes: "fused", "full", "topp" or "torch", and `self.fusing`
    whether it is a kernel path; on a CPU device only under TRITON_INTERPRET); block_tokens, cap,
    merge_blocks: their layout (kernels/sample_draw.DrawScratch)."""

    def __init__(self, n_vocab: int, device: torch.device | str, ring_tokens: int = RING_TOKENS,
                 fused: bool = False, block_tokens: int = BLOCK_TOKENS, cap: int = CAP,
                 merge_blocks: int = MERGE_BLOCKS, full: bool = True, top_p: bool = True):
        self.n_vocab, self.device, self.ring_tokens = n_vocab, torch.device(device), ring_tokens
        self.fused, self.full, self.path = fused, fused and full, "torch"
        self.select = None
        with torch.inference_mode(False):  # plain tensors: begin() refills them outside inference mode
            self._buffers()
            self.scratch, self._kernels = None, {}
            if fused:  # (triton is imported only where the fused path runs: CPU-only tests set
                # TRITON_INTERPRET before their first kernel import)
                from sparkd.engine.kernels.sample_draw import DrawScratch, full_draw, fused_draw
                from sparkd.engine.kernels.top_p_select import MAX_TOKENS, SelectScratch, top_p_draw
                self.scratch = DrawScratch(n_vocab, self.device, block_tokens, cap, merge_blocks)
                self._kernels = {"fused": fused_draw, "full": full_draw}
                if self.full and top_p and n_vocab < MAX_TOKENS:  # (larger: the torch chain)
                    self.select = SelectScratch(self.scratch, self.device)
                    self._kernels["topp"] = top_p_draw

    @property
    def fusing(self) -> bool:
        """Whether the current request draws in the Triton kernels (path "fused", "full" or "topp")."""
        return self.path != "torch"

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path begin() can choose for some request: the kernels' (the full one where full holds),
        then the torch chain. What warm() runs and StaticDecode.capture_draws captures."""
        return (*(path for path in self._kernels if path != "full" or self.full), "torch")

    def _buffers(self) -> None:
        n_vocab, ring_tokens = self.n_vocab, self.ring_tokens
        f64 = {"dtype": torch.float64, "device": self.device}
        i64 = {"dtype": torch.long, "device": self.device}
        self.temperature = torch.ones((), **f64)
        self.top_k = torch.zeros((), **i64)
        self.top_p = torch.ones((), **f64)
        self.min_p = torch.zeros((), **f64)
        self.penalty = torch.ones((), dtype=torch.float32, device=self.device)
        self.bias = torch.zeros(n_vocab, dtype=torch.float32, device=self.device)
        # the last `window` tokens fed (a set, as the host's penalty reads them); n_vocab: empty
        self.ring = torch.full((ring_tokens,), n_vocab, **i64)
        self.slot = torch.zeros(1, **i64)      # where the next token goes
        self.window = torch.full((1,), ring_tokens, **i64)
        self.ranks = torch.arange(n_vocab, **i64)
        self.generator = torch.Generator(device=self.device)
        # the fused path's: how often each token sits in the window, its Philox seed and draw count
        self.counts = torch.zeros(n_vocab + 1, dtype=torch.int32, device=self.device)  # [n_vocab]: empty
        self.ones = torch.ones(ring_tokens, dtype=torch.int32, device=self.device)  # a count per ring slot
        self.seed = torch.zeros((), **i64)
        self.draws = torch.zeros((), **i64)

    def begin(self, params: SamplingParams, history: Sequence[int] = (),
              bias: torch.Tensor | None = None) -> None:
        """Load a request: its parameters, the tail of its history (the tokens before the next one
        fed) and its logit bias [V] (None: none); reseed the generator from params.seed (None: a
        fresh nondeterministic seed)."""
        if not device_drawable(params, self.ring_tokens):
            raise EngineError(f"could not sample on the device with {params}: it needs a temperature > 0 "
                              f"and a repetition window of at most {self.ring_tokens} tokens")
        window = params.repetition_window if params.penalised else self.ring_tokens
        tail = list(history[-window:]) if params.penalised else []
        self.temperature.fill_(params.temperature)
        self.top_k.fill_(params.top_k)
        self.top_p.fill_(params.top_p)
        self.min_p.fill_(params.min_p)
        self.penalty.fill_(params.repetition_penalty if params.penalised else 1.0)
        # the bias and the window's counts made where they live: a vocabulary of zeros and a bincount on the
        # host, each copied over, cost a GPU request ~1.5 ms before its first draw (H200 trace, session 18)
        if bias is None:
            self.bias.zero_()
        else:
            self.bias.copy_(bias)
        ring = torch.full((self.ring_tokens,), self.n_vocab, dtype=torch.long)
        ring[:len(tail)] = torch.tensor(tail, dtype=torch.long)
        self.ring.copy_(ring)
        self.counts.zero_().index_add_(0, self.ring, self.ones)
        self.slot.fill_(len(tail) % window)
        self.window.fill_(window)
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed)
        self.seed.fill_(self.generator.initial_seed() & (2 ** 63 - 1))
        self.draws.zero_()
        if self.fused and fusable(params, self.scratch.cap):
            self.path = "fused"
        elif self.full and full_drawable(params, self.n_vocab):
            self.path = "full"
        elif self.select is not None and top_p_drawable(params, self.n_vocab):
            self.path = "topp"
        else:
            self.path = "torch"

    def step(self, token: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """push(token), then draw(logits): the next token [1] long (fused, full: three launches)."""
        if self.fusing:
            return self._fused(logits, token, advance=True)
        self.push(token)
        return self.draw(logits)

    def _fused(self, logits: torch.Tensor, token: torch.Tensor | None, advance: bool) -> torch.Tensor:
        return self._kernels[self.path](self, self.scratch, logits, token, advance)

    def push(self, token: torch.Tensor) -> None:
        """Add the token just fed ([1] long on the device) to the ring, over the oldest."""
        if self.fusing:  # the kernels read the window as counts (step() does this in _choose)
            one = torch.ones(1, dtype=torch.int32, device=self.device)
            self.counts.index_add_(0, self.ring.index_select(0, self.slot), -one)
            self.counts.index_add_(0, token, one)
        self.ring.index_copy_(0, self.slot, token)
        self.slot.copy_(torch.remainder(self.slot + 1, self.window))

    def warm(self) -> None:
        """Run each path's chain once (probabilities, over zeros) and draw nothing: no count, no push, no
        generator step, only the scratch written, so a process's first temperature request does not pay its
        kernels' first use (H200, draw33: the first full draw 66 ms, the first torch chain 128 ms, the draws
        after it 17 / 209 us)."""
        logits, request_path = torch.zeros(self.n_vocab, device=self.device), self.path
        try:
            for path in self.paths:
                self.path = path  # probabilities runs the current path's chain
                self.probabilities(logits)
        finally:
            self.path = request_path

    def probabilities(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(order: token ids by logit, highest first, [V] (fused: the best CAP); probs [V] float64
        by token id): the host Sampler.probabilities chain with tensor parameters, op for op (fused:
        the same math on the candidates, float64 sums in another order; full, topp: every token's,
        the order a stable argsort of the kernels' penalised logits; nothing drawn)."""
        if self.path in ("full", "topp"):
            scratch = self.scratch
            self._kernels[self.path](self, scratch, logits, None, advance=False, store=True)
            order = torch.argsort(scratch.logits, descending=True, stable=True)
            return order, scratch.weights / scratch.block_sum.sum()
        if self.fusing:
            self._fused(logits, None, advance=False)
            ids, probs = self.scratch.ids, self.scratch.probs
            live = probs > 0
            dense = torch.zeros(self.n_vocab, dtype=torch.float64, device=self.device)
            return ids, dense.index_put_((ids[live],), probs[live])
        logits = logits.reshape(-1).float() + self.bias
        seen = torch.zeros(self.n_vocab + 1, dtype=torch.bool, device=self.device)
        seen = seen.index_fill_(0, self.ring, True)[:self.n_vocab]
        logits = torch.where(seen, torch.where(logits > 0, logits / self.penalty, logits * self.penalty), logits)
        order = torch.argsort(logits, descending=True, stable=True)
        ranked = logits.gather(0, order)
        probs = softmax(ranked.double())
        keep = self.ranks < torch.where(self.top_k > 0, self.top_k, self.n_vocab)
        before = torch.cumsum(probs, dim=0) - probs
        keep &= (before < self.top_p) | (self.top_p >= 1.0)   # the host skips top_p == 1
        keep &= probs >= self.min_p * probs[0]
        keep |= self.ranks == 0                               # the most likely token survives
        kept = torch.where(keep, ranked, float("-inf"))
        filtered = torch.empty_like(logits).scatter_(0, order, kept)
        return order, softmax(filtered.double() / self.temperature)

    def draw(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token [1] long: one uniform number u, the first rank whose cumulative
        probability exceeds u times the total (a token of probability 0 is never drawn)."""
        if self.fusing:
            return self._fused(logits, None, advance=True)
        order, probs = self.probabilities(logits)
        ranked = probs.gather(0, order)                        # non-increasing: dropped ones are 0
        cdf = torch.cumsum(ranked, dim=0)
        u = torch.rand(1, generator=self.generator, dtype=torch.float64, device=self.device)
        rank = torch.searchsorted(cdf, u * cdf[-1:], right=True)
        last = torch.count_nonzero(ranked).sub(1).view(1)     # rounding past the total: the last > 0
        return order.gather(0, torch.minimum(rank, last))
