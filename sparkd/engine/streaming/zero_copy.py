"""Zero-copy experts for the GPU kernels (`--unified`): the selected experts' raw blocks stay in
their arena slots (pinned host memory when CUDA is used) and the Triton MoE decode kernels read
them there through the offset table — no dequantized copy and no staging copy to VRAM. On a
unified-memory GPU (GB10) that is the fast path; on a discrete GPU (H200) every byte crosses PCIe
once per use, which is the correctness path until a VRAM expert cache exists.
"""

from __future__ import annotations

from typing import Sequence

from sparkd.engine.errors import EngineError
from sparkd.engine.layers.act_round import vec_dot_format
from sparkd.engine.layers.quant_experts import KernelSelection


def kernel_select(store, layer: int, expert_ids: Sequence[int], device) -> KernelSelection | None:
    """Make `expert_ids` of `layer` resident in the store's arena (reading misses, waiting for
    them) and describe their slots as a prepared kernel table; None if the layer has expert
    biases or a type without a kernel (the caller takes the generic path)."""
    from sparkd.engine.kernels import dispatch
    from sparkd.engine.kernels.moe import ExpertTable, prepare
    from sparkd.engine.streaming.store import _Batch

    lay = store._layer(layer)
    gate, up, down = lay.infos
    if any(b is not None for b in lay.biases) or gate.ggml_type != up.ggml_type \
            or not {gate.ggml_type, down.ggml_type} <= set(dispatch.FAMILIES):
        return None
    ids = [int(e) for e in expert_ids]
    with store._lock:
        store._pinned.clear()  # the previous layer is done with its experts
        store._record(layer, ids)
        batch = _Batch(store, layer, ids)
    if batch.deferred:  # the kernels need every selected expert in a slot at once
        raise EngineError(f"could not hold the {len(ids)} experts of layer {layer} in the expert "
                          f"cache at once for the GPU kernels: every slot is pinned (raise the budget)")
    for j, read in list(batch.reads.items()):
        batch._wait(j, read)
    offsets: tuple[list[int], ...] = ([], [], [])
    for j, e in enumerate(ids):
        base = batch.slots[j] * store.arena.slot_bytes
        for k, part in enumerate(store.parts(layer, e)):
            offsets[k].append(base + part.data_offset)
    arena = store.arena.tensor
    _, width, dim = gate.shape  # [E, F, D] in torch order
    table = ExpertTable(arena, arena, arena, *offsets, gate.ggml_type, down.ggml_type, dim, width)
    return KernelSelection(prepare(table, device), vec_dot_format(gate.ggml_type),
                           vec_dot_format(down.ggml_type))
