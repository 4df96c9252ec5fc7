"""Experts for the GPU kernels: the selected experts' raw blocks are read by the Triton MoE decode
kernels where they are, without a dequantized copy: from VRAM slots (streaming/vram.py) when a
discrete GPU has a VRAM expert cache and the expert is in it, else in place from their arena slots
(pinned host memory, `--unified on`/integrated GPUs: zero-copy; on a discrete GPU every such byte
crosses PCIe once per use).

One kernel table mixes the two: the decode kernels take one base buffer per projection plus a
byte offset per expert, so with a VRAM cache the base is the VRAM buffer and an arena expert's
offset is its address minus the VRAM buffer's (CUDA's unified virtual addressing puts pinned host
memory and device memory in one 64-bit address space; the interpreter reads raw addresses too).
Experts admitted to VRAM are copied from their arena slot after their read, on the cache's side
stream; this token's kernel still reads them from the arena.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

from sparkd.engine.errors import EngineError
from sparkd.engine.layers.act_round import vec_dot_format
from sparkd.engine.layers.quant_experts import KernelSelection


def kernel_select(store, layer: int, expert_ids: Sequence[int], device) -> KernelSelection | None:
    """Make `expert_ids` of `layer` readable by the kernels (VRAM hits as they are; the rest read
    into the arena, waited for) and describe them as a prepared kernel table; None if the layer has
    expert biases or a type without a kernel (the caller takes the generic path)."""
    from sparkd.engine.kernels import dispatch
    from sparkd.engine.streaming.store import _Batch

    lay = store._layer(layer)
    gate, up, down = lay.infos
    if any(b is not None for b in lay.biases) or gate.ggml_type != up.ggml_type \
            or not {gate.ggml_type, down.ggml_type} <= set(dispatch.FAMILIES):
        return None
    ids = [int(e) for e in expert_ids]
    vram = store.vram
    with store._lock:
        store.start_layer()
        store._record(layer, ids)
        if vram is not None:
            vram.note_step(store._step)
            in_vram = vram.use([(layer, e) for e in ids])
        else:
            in_vram = {}
        host_ids = [e for e in ids if (layer, e) not in in_vram]
        batch = _Batch(store, layer, host_ids)
    if batch.deferred:  # the kernels need every selected expert in a slot at once
        raise EngineError(f"could not hold the {len(host_ids)} experts of layer {layer} in the expert "
                          f"cache at once for the GPU kernels: every slot is pinned (raise the budget)")
    for j, read in list(batch.reads.items()):
        batch._wait(j, read)
    host_slot = {e: batch.slots[j] for j, e in enumerate(host_ids)}
    t0 = time.perf_counter()
    if vram is not None:
        _admit(store, layer, host_ids, host_slot, in_vram)
    t1 = time.perf_counter()
    table = _table(store, layer, ids, in_vram, host_slot, device)
    store.stats.vram_admit_seconds += t1 - t0
    store.stats.table_seconds += time.perf_counter() - t1
    return table


def _admit(store, layer: int, host_ids: list[int], host_slot: dict[int, int], in_vram: dict) -> None:
    """Offer the experts just served from the arena to the VRAM cache (copies start now)."""
    busy = set(in_vram)  # this token's VRAM experts: not victims
    for e in host_ids:
        used = max(p.slot_offset + p.read_len for p in store.parts(layer, e))
        source = store.arena.view(host_slot[e], 0, used)
        if store.vram.offer((layer, e), source, busy):
            store._pinned.add((layer, e))


def _table(store, layer: int, ids: list[int], in_vram: dict, host_slot: dict[int, int], device):
    from sparkd.engine.kernels.moe import ExpertTable, offsets_on, prepare

    gate, _, down = store._layer(layer).infos
    arena = store.arena.tensor
    base = arena if store.vram is None else store.vram.buffer
    arena_at = arena.data_ptr() - base.data_ptr()  # 0 without a VRAM cache
    offsets: tuple[list[int], ...] = ([], [], [])
    for e in ids:
        slot = in_vram.get((layer, e))
        start = store.vram.slot_offset(slot) if slot is not None else \
            arena_at + host_slot[e] * store.arena.slot_bytes
        for k, part in enumerate(store.parts(layer, e)):
            offsets[k].append(start + part.data_offset)
    _, width, dim = gate.shape  # [E, F, D] in torch order
    if arena_at == 0:
        table = ExpertTable(base, base, base, *offsets, gate.ggml_type, down.ggml_type, dim, width)
        prepared = prepare(table, device)
    else:  # checked on the first slot of the base buffer, then given the real (mixed) offsets
        first = [[p.data_offset] for p in store.parts(layer, ids[0])]
        prepared = prepare(ExpertTable(base, base, base, *first, gate.ggml_type, down.ggml_type, dim, width),
                           device)
        gate_off, up_off, down_off = offsets_on(offsets, prepared.device)
        prepared = replace(prepared, gate_off=gate_off, up_off=up_off, down_off=down_off)
    return KernelSelection(prepared, vec_dot_format(gate.ggml_type), vec_dot_format(down.ggml_type))
