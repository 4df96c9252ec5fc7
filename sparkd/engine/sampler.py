"""Next-token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty.

The order follows llama.cpp's default chain: repetition penalty, then the top-k / top-p / min-p
filters on the penalised logits, then temperature, then a draw. A seed makes the draws
reproducible (a private torch.Generator; nothing global is touched).
"""

from __future__ import annotations

from dataclasses import dataclass
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


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """-inf for every token the filters drop; the most likely token always survives."""
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

    def __call__(self, logits: torch.Tensor, history: Sequence[int] = ()) -> int:
        if logits.dim() != 1:
            raise SamplingError(f"could not sample: logits must be one row [vocab], got shape {tuple(logits.shape)}")
        p = self.params
        if p.temperature == 0:
            return int(greedy_pick(self._penalised(logits, history)))
        return int(torch.multinomial(self.probabilities(logits, history), 1, generator=self.generator))

    def probabilities(self, logits: torch.Tensor, history: Sequence[int] = ()) -> torch.Tensor:
        """The distribution a temperature draw samples from: float64 [vocab], 0 where the filters
        drop a token (device_sampler.DeviceSampler computes the same, op for op)."""
        p = self.params
        logits = filter_logits(self._penalised(logits, history), p.top_k, p.top_p, p.min_p)
        return torch.softmax(logits.double() / p.temperature, dim=0)

    def _penalised(self, logits: torch.Tensor, history: Sequence[int]) -> torch.Tensor:
        p = self.params
        logits = logits.float()
        if p.repetition_window:
            logits = apply_repetition_penalty(logits, history[-p.repetition_window:], p.repetition_penalty)
        return logits
