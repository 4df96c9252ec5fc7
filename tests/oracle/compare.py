"""Measures for comparing our logits with llama.cpp's, and our greedy decode (sparkd side)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Agreement:
    rel_err: float  # max |ours - ref| / max |ref| over all positions
    top1: float  # fraction of positions whose argmax agrees
    kl: float  # mean KL(ref || ours) per position, nats

    def __str__(self) -> str:
        return f"rel {self.rel_err:.2e}, top-1 {self.top1:.3f}, KL {self.kl:.2e}"


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def agreement(ref: np.ndarray, got: np.ndarray) -> Agreement:
    lp, lq = _log_softmax(ref), _log_softmax(got)
    return Agreement(
        rel_err=float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max()),
        top1=float((got.argmax(-1) == ref.argmax(-1)).mean()),
        kl=float((np.exp(lp) * (lp - lq)).sum(-1).mean()))


def full_logits(net, tokens: list[int]) -> np.ndarray:
    """All-position logits of one forward pass over tokens, float64 [T, V]."""
    return net(torch.tensor(tokens), net.new_cache(len(tokens))).double().numpy()


def incremental_logits(net, tokens: list[int], n_prompt: int) -> np.ndarray:
    """The same logits, computed as a prompt batch followed by one token per step."""
    cache = net.new_cache(len(tokens))
    steps = [net(torch.tensor(tokens[:n_prompt]), cache)]
    steps += [net(torch.tensor(tokens[i:i + 1]), cache) for i in range(n_prompt, len(tokens))]
    return torch.cat(steps).double().numpy()


def greedy(net, prompt: list[int], n_new: int) -> list[int]:
    """Greedy continuation with the KV cache, one token per step (ties: lowest id)."""
    cache = net.new_cache(len(prompt) + n_new)
    logits = net(torch.tensor(prompt), cache)
    out = [int(torch.argmax(logits[-1]))] if n_new else []
    while len(out) < n_new:  # no step after the last pick: nothing reads its logits
        logits = net(torch.tensor(out[-1:]), cache)
        out.append(int(torch.argmax(logits[-1])))
    return out


def first_divergence(path, prompt: list[int], ours: list[int], theirs: list[int], logits_fn, net):
    """(index, theirs_margin, our_margin) where two greedy continuations first differ, None if equal.
    theirs_margin: llama.cpp's own logit of its pick minus that of ours at that point; our_margin: ours
    of our pick minus theirs, from the same KV-cache steps greedy took. A small margin on either side is
    a near-tie: that side's pick flips with float order (an AVX-512 machine against an AVX2 one)."""
    if ours == theirs:
        return None
    i = next(j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    row = logits_fn(path, prompt + theirs[:i])[-1]
    mine = _stepped_logits(net, prompt, ours[:i])
    return i, float(row[theirs[i]] - row[ours[i]]), float(mine[ours[i]] - mine[theirs[i]])


def near_tie(div, bound: float) -> bool:
    """Whether a first_divergence result is a near-tie on either side (margin at most bound)."""
    return min(abs(div[1]), abs(div[2])) <= bound


def _stepped_logits(net, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The last logits row after the prompt and then `tokens` one at a time with the KV cache, as greedy."""
    cache = net.new_cache(len(prompt) + len(tokens) + 1)
    logits = net(torch.tensor(prompt), cache)
    for t in tokens:
        logits = net(torch.tensor([t]), cache)
    return logits[-1]
