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

The table is built for every layer of every token, after the layer's reads land, so its host cost
is part of each decode step:
by default (SPARKD_STREAM_TABLE=cached) the layer's types, buffers and one expert's offsets are
checked once through the kernels' prepare() and kept; per call only the offsets are made, checked
in Python (alignment, inside the slot's buffer) and copied to the device in one copy.
SPARKD_STREAM_TABLE=checked goes back to a full prepare() per call.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

from sparkd.engine import switches
from sparkd.engine.errors import EngineError
from sparkd.engine.layers.act_round import vec_dot_format
from sparkd.engine.layers.quant_experts import KernelSelection

TABLE_ENV = "SPARKD_STREAM_TABLE"
TABLE_MODES = ("cached", "checked")


def table_mode(env: dict | None = None) -> str:
    return switches.choice(TABLE_ENV, TABLE_MODES, "cached", env)


def kernel_select(store, layer: int, expert_ids: Sequence[int], device, offsets_out=None) -> KernelSelection | None:
    """Make `expert_ids` of `layer` readable by the kernels (VRAM hits as they are; the rest read
    into the arena, waited for) and describe them as a prepared kernel table, with their biases where the layer has
    them (gpt-oss: _with_biases); None for a type without a kernel (the caller takes the generic path). offsets_out:
    where the cached table's offsets go (int64 [3 x count] on device), else a new tensor."""
    from sparkd.engine.streaming.store import _Batch

    if not _kernel_layer(store, layer):
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
    store.stats.admission_seconds += time.perf_counter() - t0
    sel = _build(store, layer, ids, in_vram, host_slot, device, offsets_out)
    return _with_biases(store, layer, ids, sel, device, kept=offsets_out is not None)


def _with_biases(store, layer: int, ids: list[int], sel: KernelSelection, device, kept: bool) -> KernelSelection:
    """sel with the selected experts' biases as moe_decode takes them for a table of the selection's own offsets:
    their gate | up | down rows [A, 2F + D] (a missing part zeros), gathered on the host, where the store keeps the
    biases with the trunk (session 25; before, a biased layer took the generic path), and copied to the device: into
    the kept selection's own buffer where it is kept (a caller's graph reads it there), else a new tensor. sel as it
    is for a layer without biases."""
    import torch

    lay = store._layer(layer)
    if all(b is None for b in lay.biases):
        return sel
    _, width, dim = lay.infos[0].shape  # [E, F, D] in torch order
    idx = torch.as_tensor(ids, dtype=torch.long)
    rows = torch.cat([torch.zeros(len(ids), n) if b is None else b.index_select(0, idx).float().reshape(len(ids), n)
                      for b, n in zip(lay.biases, (width, width, dim))], 1)
    if not kept:
        return replace(sel, bias=rows.to(device))
    if sel.bias is None or sel.bias.shape != rows.shape:
        sel.bias = torch.empty(rows.shape, dtype=torch.float32, device=device)
    sel.bias.copy_(rows)
    return sel


def _kernel_layer(store, layer: int) -> bool:
    """Whether the MoE kernels can run the layer: gate and up of one type, and kernels for its types (expert biases
    too since session 25)."""
    from sparkd.engine.kernels import dispatch

    gate, up, down = store._layer(layer).infos
    return gate.ggml_type == up.ggml_type and dispatch.multiplies(gate.ggml_type, gate.shape[-1]) \
        and dispatch.multiplies(down.ggml_type, down.shape[-1])


def x_format(store, layer: int, device) -> str | None:
    """The int8 block format the decode kernels quantize the layer's x to (its gate/up family's,
    from the layer's checked template), None where they do not run or multiply floats."""
    if not _kernel_layer(store, layer):
        return None
    base = store.arena.tensor if store.vram is None else store.vram.buffer
    gate_up = _template(store, layer, 0, base, device).gate_up
    return gate_up.act_fmt if gate_up.idot is not None else None


def _build(store, layer: int, ids: list[int], in_vram: dict, host_slot: dict[int, int], device, offsets_out=None):
    t0 = time.perf_counter()
    if offsets_out is not None and store.table_mode != "cached":
        raise EngineError(f"could not build the kernel table of layer {layer} into a given offsets buffer: "
                          f"{TABLE_ENV}={store.table_mode} makes its own (use cached)")
    if store.table_mode == "cached":
        table = _table_cached(store, layer, ids, in_vram, host_slot, device, offsets_out)
    else:
        table = _table(store, layer, ids, in_vram, host_slot, device)
    store.stats.table_seconds += time.perf_counter() - t0
    return table


def _admit(store, layer: int, host_ids: list[int], host_slot: dict[int, int], in_vram: dict) -> None:
    """Offer the experts just served from the arena to the VRAM cache (copies start now)."""
    busy = set(in_vram)  # this token's VRAM experts: not victims
    for e in host_ids:
        if store.vram.offer((layer, e), _source(store, layer, e, host_slot[e]), busy):
            store._pinned.add((layer, e))


def _source(store, layer: int, expert: int, slot: int):
    """The bytes a VRAM copy of the expert takes from its arena slot, made only if admitted."""
    def view():
        used = max(p.slot_offset + p.read_len for p in store.parts(layer, expert))
        return store.arena.view(slot, 0, used)
    return view


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


def _table_cached(store, layer: int, ids: list[int], in_vram: dict, host_slot: dict[int, int], device,
                  offsets_out=None):
    """_table's result with the layer's checks done once (see the module doc); the offsets copied
    into offsets_out where given (the selection over it then made once and kept)."""
    import torch

    gate, _, down = store._layer(layer).infos
    arena = store.arena.tensor
    vram = store.vram
    base = arena if vram is None else vram.buffer
    arena_at = arena.data_ptr() - base.data_ptr()  # 0 without a VRAM cache
    tpl = _template(store, layer, ids[0], base, device)
    slot_bytes, align = store.arena.slot_bytes, max(tpl.gate_up.align, tpl.down.align)
    offsets: tuple[list[int], ...] = ([], [], [])
    for e in ids:
        slot = in_vram.get((layer, e))
        if slot is not None:
            start, low, high = vram.slot_offset(slot), 0, vram.buffer.numel()
        else:
            start, low, high = arena_at + host_slot[e] * slot_bytes, arena_at, arena_at + arena.numel()
        rel = _in_slot(store, layer, e, tpl)
        if rel is None or start < low or start + slot_bytes > high or start % align:
            _check_parts(store, layer, e, tpl, start, low, high)  # the clear error, or fine after all
            rel = [p.data_offset for p in store.parts(layer, e)]
        for k in range(3):
            offsets[k].append(start + rel[k])
    n = len(ids)
    host = torch.tensor(offsets[0] + offsets[1] + offsets[2], dtype=torch.int64)
    if offsets_out is None:
        on_device = host.to(tpl.device, non_blocking=True)
        prepared = replace(tpl, gate_off=on_device[:n], up_off=on_device[n:2 * n], down_off=on_device[2 * n:])
        return KernelSelection(prepared, vec_dot_format(gate.ggml_type), vec_dot_format(down.ggml_type))
    if offsets_out.shape != host.shape or offsets_out.dtype != torch.int64 \
            or offsets_out.device.type != torch.device(tpl.device).type:
        raise EngineError(f"could not copy the kernel table offsets of layer {layer}: need int64 "
                          f"{list(host.shape)} on {tpl.device}, got {offsets_out.dtype} "
                          f"{list(offsets_out.shape)} on {offsets_out.device}")
    offsets_out.copy_(host, non_blocking=True)
    key = (id(tpl), offsets_out.data_ptr(), n, gate.ggml_type, down.ggml_type)
    sel = store.selections.get(key)
    if sel is None:  # the same views of the same buffer every call: made once
        prepared = replace(tpl, gate_off=offsets_out[:n], up_off=offsets_out[n:2 * n], down_off=offsets_out[2 * n:])
        sel = store.selections[key] = KernelSelection(prepared, vec_dot_format(gate.ggml_type),
                                                      vec_dot_format(down.ggml_type))
    return sel


def _part_spans(tpl) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(bytes, alignment) of an expert's gate, up and down parts as the template's kernels read them."""
    spans = (tpl.gate_up_row_bytes * tpl.table.width,) * 2 + (tpl.down_row_bytes * tpl.table.dim,)
    return spans, (tpl.gate_up.align,) * 2 + (tpl.down.align,)


def _in_slot(store, layer: int, expert: int, tpl) -> list[int] | None:
    """The expert's gate, up and down offsets inside its slot, kept once checked to leave each part's
    span inside the slot on the template's alignment (then a slot start on that alignment inside its
    buffer places every part as _check_parts wants); None where they do not."""
    key = (layer, expert, id(tpl))
    if key not in store.table_parts:
        spans, aligns = _part_spans(tpl)
        rel = [p.data_offset for p in store.parts(layer, expert)]
        fits = all(r + sp <= store.arena.slot_bytes and r % a == 0 for r, sp, a in zip(rel, spans, aligns))
        store.table_parts[key] = rel if fits else None
    return store.table_parts[key]


def _check_parts(store, layer: int, expert: int, tpl, start: int, low: int, high: int) -> None:
    """Every part of the expert at slot start `start` inside [low, high) and aligned, else the clear error."""
    spans, aligns = _part_spans(tpl)
    for k, part in enumerate(store.parts(layer, expert)):
        at = start + part.data_offset
        if at < low or at + spans[k] > high or at % aligns[k]:
            raise EngineError(f"could not build the kernel table of layer {layer}: expert {expert}'s part {k} at "
                              f"byte {at - low} of its {high - low}-byte buffer does not leave {spans[k]} bytes "
                              f"or is not a multiple of {aligns[k]}")


def _template(store, layer: int, expert: int, base, device):
    """A table of the layer's types and shape over `base`, checked by prepare() on one expert at
    slot 0; kept per (types, shape, buffer, device), so once for all layers of one shape."""
    from sparkd.engine.kernels.moe import ExpertTable, prepare

    gate, _, down = store._layer(layer).infos
    _, width, dim = gate.shape  # [E, F, D] in torch order
    key = (gate.ggml_type, down.ggml_type, dim, width, base.data_ptr(), base.numel(), str(device))
    tpl = store.tables.get(key)
    if tpl is None:
        first = [[p.data_offset] for p in store.parts(layer, expert)]
        tpl = prepare(ExpertTable(base, base, base, *first, gate.ggml_type, down.ggml_type, dim, width), device)
        store.tables[key] = tpl
    return tpl
