"""Next-token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty.

The order follows llama.cpp's default chain: repetition penalty, then the top-k / top-p / min-p
filters on the penalised logits, then temperature, then a draw. A seed makes the draws
reproducible (a private torch.Generator; nothing global is touched).

The filters are defined over the whole row ranked by a stable argsort (filter_logits_sorted); as
llama.cpp does, filter_logits ranks only the few tokens that can survive (torch.topk, or a bound
from min-p / top-p) and gets the same tensor bit for bit, so the draws are the same too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from sparkd.engine.errors import EngineError


class SamplingError(EngineError):
    """Sampling parameters out of range, or logits the sampler cannot use."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0       # 0 means greedy
    top_k: int = 0                 # 0 keeps every token
    top_p: float = 1.0             # 1 keeps every token
    min_p: float = 0.0             # 0 keeps every token
    repetition_penalty: float = 1.0
    repetition_window: int = 64    # how many recent tokens the penalty looks at (llama.cpp's default)
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = (("temperature", self.temperature >= 0, ">= 0"), ("top_k", self.top_k >= 0, ">= 0"),
                  ("top_p", 0 < self.top_p <= 1, "in (0, 1]"), ("min_p", 0 <= self.min_p <= 1, "in [0, 1]"),
                  ("repetition_penalty", self.repetition_penalty > 0, "> 0"),
                  ("repetition_window", self.repetition_window >= 0, ">= 0"))
        for name, ok, expected in checks:
            if not ok:
                raise SamplingError(f"could not use sampling parameter {name}={getattr(self, name)!r}: "
                                    f"it must be {expected}")

    @property
    def penalised(self) -> bool:
        """Whether the repetition penalty changes any logit (a factor other than 1 over a window)."""
        return self.repetition_penalty != 1.0 and self.repetition_window > 0


def apply_repetition_penalty(logits: torch.Tensor, history: Sequence[int], penalty: float) -> torch.Tensor:
    """Each token seen in history: positive logits divided by penalty, negative ones multiplied."""
    if penalty == 1.0 or not history:
        return logits
    ids = torch.tensor(sorted(set(history)), dtype=torch.long)
    seen = logits[ids]
    out = logits.clone()
    out[ids] = torch.where(seen > 0, seen / penalty, seen * penalty)
    return out


def filter_logits_sorted(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """filter_logits by its definition, over the whole ranked row: what filter_logits returns, and
    where filter_logits cannot bound the survivors (or a decision is too close to call) it runs this."""
    # V vocabulary
    order = torch.argsort(logits, descending=True, stable=True)   # [V]
    ranked = logits[order]                                        # [V]
    keep = torch.ones_like(ranked, dtype=torch.bool)
    if top_k > 0:
        keep[top_k:] = False
    probs = torch.softmax(ranked.double(), dim=0)
    if top_p < 1.0:
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is short.
        before = torch.cumsum(probs, dim=0) - probs
        keep &= before < top_p
    if min_p > 0.0:
        keep &= probs >= min_p * probs[0]
    keep[0] = True
    out = torch.full_like(logits, float("-inf"))
    out[order[keep]] = logits[order[keep]]
    return out


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """-inf for every token the filters drop; the most likely token always survives.

    The same tensor as filter_logits_sorted, bit for bit, without ranking the whole row (a stable
    argsort of 151936 floats is most of the cost): only the tokens that can survive are ranked
    (see survivors()); the full sort runs where no such bound is found."""
    if top_k >= logits.numel():
        top_k = 0                      # keep[top_k:] drops nothing
    if top_k == 0 and top_p >= 1.0 and min_p <= 0.0:
        return logits.clone()
    found = survivors(logits, top_k, top_p, min_p)
    if found is None:
        return filter_logits_sorted(logits, top_k, top_p, min_p)
    out = torch.full_like(logits, float("-inf"))
    out[found] = logits[found]
    return out


def survivors(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor | None:
    """The ids filter_logits_sorted keeps (in ranked order), found by ranking only the candidates:
    the tokens at or above a logit every survivor reaches. None where that cannot be settled: a
    row whose best logit is not finite (NaN, +inf, all -inf), no bound short of the whole row, or
    a filter decision within rounding of its threshold."""
    best = logits.max()
    if not torch.isfinite(best):
        return None
    exps = total = None
    if top_p < 1.0 or min_p > 0.0:
        # torch.softmax's exps (the best token's is 1), summed in another order than its sum
        exps = torch.exp(logits.double() - best.double())
        total = exps.sum()
    floor = _floor(logits, exps, total, top_k, top_p, min_p)
    if floor is None:
        return None
    ids = torch.nonzero(logits >= floor).squeeze(1)                    # ascending: ties by lower id
    ids = ids[torch.argsort(logits[ids], descending=True, stable=True)]
    if top_k > 0:
        ids = ids[:top_k]
    if exps is None:
        return ids                     # top-k alone
    keep = _decide(exps[ids] / total, top_p, min_p, _tolerance(logits.numel()))
    return None if keep is None else ids[keep]


def _tolerance(n_vocab: int) -> float:
    """How far (relative) a probability computed here may be from torch.softmax's: both sum the same
    exps (each within a few ulps) in other orders, and a sum of n terms is within n * 2^-53 of the
    exact one; 64x that covers both sums, the exps and the cumulative sums with room to spare."""
    return 64 * n_vocab * 2.0 ** -53


def _floor(logits: torch.Tensor, exps: torch.Tensor | None, total: torch.Tensor | None, top_k: int,
           top_p: float, min_p: float) -> torch.Tensor | None:
    """A logit every surviving token reaches (0-dim), or None where only the whole row bounds them."""
    if top_k > 0:
        return torch.topk(logits, min(top_k, logits.numel()), sorted=False).values.min()
    tol, least = _tolerance(logits.numel()), 0.0     # a token whose exp is below least is surely dropped
    if min_p > 0.0:
        least = min(min_p - 4 * tol, 1.0)             # min_p times the best token's exp, 1 (it survives)
    if top_p < 1.0:
        least = max(least, _mass_threshold(exps, float(total) * (top_p + tol)))
    return logits[exps >= least].min() if least > 0.0 else None


def _mass_threshold(exps: torch.Tensor, mass: float) -> float:
    """The largest power of two t such that the exps >= t add up to at least `mass` (0.0 if none):
    every rank after those tokens has that much before it, so top_p drops it. One pass: the exps
    (float64 in [0, 1]) summed per binade, read off their exponent bits."""
    biased = exps.view(torch.int64) >> 52                                # [2^(e-1023), 2^(e-1022))
    per_binade = torch.bincount(biased, weights=exps, minlength=1024).flip(0)   # [b]: from 2^-b
    reached = torch.nonzero(torch.cumsum(per_binade, dim=0) >= mass)
    # the last binade (b = 1023) also holds the subnormals and 0: no power of two bounds it
    return 2.0 ** -int(reached[0]) if len(reached) and int(reached[0]) < 1023 else 0.0


def _decide(ranked: torch.Tensor, top_p: float, min_p: float, tol: float) -> torch.Tensor | None:
    """filter_logits_sorted's keep mask over the candidates' probabilities in ranked order, or None
    if a decision lies within tol of its threshold (there the two sums' rounding could flip it)."""
    keep = torch.ones_like(ranked, dtype=torch.bool)
    near = torch.zeros_like(keep)
    if top_p < 1.0:
        before = torch.cumsum(ranked, dim=0) - ranked
        keep &= before < top_p
        near |= (before - top_p).abs() <= tol
    if min_p > 0.0:
        edge = min_p * ranked[0]
        keep &= ranked >= edge
        near |= (ranked - edge).abs() <= 4 * tol * ranked[0]
    keep[0], near[0] = True, False
    return None if bool(near.any()) else keep


def greedy_pick(logits: torch.Tensor) -> torch.Tensor:
    """The greedy token of one row of logits as a 0-dim long tensor on the logits' device (no
    host sync): torch.argmax, the lowest id among ties, a NaN wins over any number (CPU and CUDA
    alike). The one op both the host sampler and the CUDA graph's device pick use."""
    return torch.argmax(logits)


class Sampler:
    """Picks the next token from one row of logits."""

    def __init__(self, params: SamplingParams = SamplingParams()):
        self.params = params
        self.generator = torch.Generator()
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        else:
            self.generator.seed()

    @property
    def plain_argmax(self) -> bool:
        """Whether every pick is torch.argmax of the raw logits (greedy, no repetition penalty):
        then the device may pick the token itself (StaticDecode.next_token) and only it comes
        back. Temperature draws take the device sampler (device_sampler.py) unless it is switched
        off: the same distribution, another random stream than this host generator's."""
        return self.params.temperature == 0 and not self.params.penalised

    def __call__(self, logits: torch.Tensor, history: Sequence[int] = (), bias: torch.Tensor | None = None) -> int:
        """The pick from one row of logits [V] after `history`; bias: a logit bias [V] added first (None: none)."""
        if logits.dim() != 1:
            raise SamplingError(f"could not sample: logits must be one row [vocab], got shape {tuple(logits.shape)}")
        if bias is not None:
            logits = logits + bias
        p = self.params
        if p.temperature == 0:
            return int(greedy_pick(self._penalised(logits, history)))
        return int(torch.multinomial(self.probabilities(logits, history), 1, generator=self.generator))

    def probabilities(self, logits: torch.Tensor, history: Sequence[int] = ()) -> torch.Tensor:
        """The distribution a temperature draw samples from: float64 [vocab], 0 where the filters
        drop a token (device_sampler.DeviceSampler computes the same: filter_logits_sorted's chain,
        op for op)."""
        p = self.params
        logits = filter_logits(self._penalised(logits, history), p.top_k, p.top_p, p.min_p)
        return torch.softmax(logits.double() / p.temperature, dim=0)

    def _penalised(self, logits: torch.Tensor, history: Sequence[int]) -> torch.Tensor:
        p = self.params
        logits = logits.float()
        if p.repetition_window:
            logits = apply_repetition_penalty(logits, history[-p.repetition_window:], p.repetition_penalty)
        return logits


def warm_sampler(params: SamplingParams, n_vocab: int) -> None:
    """One draw of a throwaway Sampler with these parameters over a made-up row (seed 0: no request's
    generator moves), so a process's first host draw (generate's first token) does not pay its CPU
    ops' first use."""
    Sampler(replace(params, seed=0))(torch.linspace(0.0, -16.0, n_vocab))
