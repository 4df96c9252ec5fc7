"""Prefetch: before block i runs, apply the next MoE layer's router to block i's input and ask the
store to read the experts it picks at low priority. The residual stream changes little from one
layer to the next, so this guesses most of the next layer's experts a layer ahead of need.

The eager step runs it from block hooks (attach_prefetch); the streamed step's per-layer graphs
(graph_step.SegmentDecode) compute the same guess (guess) inside the segment and ask for it
(request) on the host between segments, in the hooks' order."""

from __future__ import annotations

import torch
from torch import nn

from sparkd.engine.layers.moe import MoE


def attach_prefetch(net: nn.Module, store, max_tokens: int = 1) -> list:
    """Register the hooks on a Decoder; returns their handles (call .remove() to detach).

    Only batches of up to max_tokens tokens prefetch: a long prompt touches most experts anyway
    and its reads are demand reads.
    """
    blocks = list(net.blocks)
    moe_at = [i for i, b in enumerate(blocks) if isinstance(b.ffn, MoE)]
    # a new pass: on the first block, not the net, since the eager step's device pick runs the
    # blocks through net.run (no net forward); registered first, so before block 0's guess
    handles = [blocks[0].register_forward_pre_hook(lambda mod, args: store.begin_step())]
    for i in range(len(blocks)):
        nxt = next((j for j in moe_at if j > i), None)
        if nxt is not None:
            handles.append(blocks[i].register_forward_pre_hook(_hook(blocks[nxt], store, max_tokens)))
    return handles


def guess(target, x: torch.Tensor) -> torch.Tensor:
    """The routing ids [T, A] block `target`'s router picks for the residual stream x [T, D]."""
    return target.ffn.router(target.ffn_norm(x))[1]


def request(store, target, ids: torch.Tensor) -> None:
    """Ask the store to read the guessed experts of block `target` (waits for ids)."""
    store.prefetch(target.ffn.il, torch.unique(ids).tolist())


def _hook(target, store, max_tokens: int):
    def hook(mod, args):
        x = mod.residual(args[0])  # [T, D] residual stream entering the block
        if x.shape[0] > max_tokens:
            return
        with torch.inference_mode():
            ids = guess(target, x)
        request(store, target, ids)
    return hook
