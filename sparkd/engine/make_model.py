"""Generate a random-weight GGUF that llama.cpp loads: `sparkd-engine make-model`.

Tensors are written in the order they are declared, block by block from a seeded generator, so a
model of tens of GB streams to disk with bounded memory. Norms, biases and routers stay F32 (as
llama.cpp's converters keep them); a tensor whose rows do not fill the quant's blocks falls back as
llama-quantize's does (FALLBACK: Q4_K to Q5_0, the i-quants to IQ4_NL, ...; F16 where those do not fit
either). K-quant blocks are generated directly; `requantize` is the hook for running llama.cpp's
llama-quantize on an F16/F32 result instead (imatrix types, exact quantizers).

A sparse model (`--sparse`) has the real header, metadata and tensor table but no data: each
tensor's bytes are a hole (seek + truncate), so the file has its full size and takes almost no
disk. The memory plan and `inspect` read only the header, so a 634 GB model can be planned from a
file of a few MB; any ggml type can be declared there, since no block is generated.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFWriter, LlamaFileType

from sparkd.engine.modelgen import blocks, specs
from sparkd.engine.modelgen.shape import Shape
from sparkd.engine.modelgen.tokenizer import CHAT_TEMPLATE, make_tokenizer

QUANTS = {t.name: t for t in blocks.FLOAT_TYPES + blocks.QUANT_TYPES}
ANY_TYPE = {t.name: t for t in GGML_QUANT_SIZES}  # declarable in a sparse model (no data written)
Progress = Callable[[int, int], None]  # (bytes done, bytes total)


@dataclass
class Plan:
    shape: Shape
    qtype: Q
    tensors: list[tuple[str, tuple[int, ...], Q, float, float]]  # name, shape, type, std, mean

    @property
    def nbytes(self) -> int:
        return sum(blocks.tensor_nbytes(q, math.prod(sh)) for _, sh, q, _, _ in self.tensors)


# llama-quantize's type for rows a 256-value type's blocks do not divide (llama-quant.cpp tensor_type_fallback): a
# 32-value type of about its bits; F16 where those do not divide the rows either (and for the 32-value types)
FALLBACK = {**dict.fromkeys((Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ4_XS), Q.IQ4_NL),
            **dict.fromkeys((Q.Q2_K, Q.Q3_K, Q.TQ1_0, Q.TQ2_0), Q.Q4_0), Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1,
            Q.Q6_K: Q.Q8_0}


def tensor_type(qtype: Q, shape: tuple[int, ...], kind: str) -> Q:
    if kind == "ids":  # a routing table of expert ids (DeepSeek V4's hash layers)
        return Q.I32
    if kind != "w":
        return Q.F32
    if shape[-1] % blocks.block_size(qtype):
        fallback = FALLBACK.get(qtype, Q.F16)
        return fallback if shape[-1] % blocks.block_size(fallback) == 0 else Q.F16
    return qtype


def plan(shape: Shape, quant: str, tensor_types: list[tuple[str, str]] | None = None,
         sparse: bool = False) -> Plan:
    """tensor_types: (regex, type) pairs; a weight whose name matches one (first wins) gets that
    type instead of `quant` (as llama-quantize's --tensor-type). Sparse plans accept any type."""
    known = ANY_TYPE if sparse else QUANTS
    overrides = [(re.compile(pattern), _qtype(name, known, f"--tensor-type {pattern}={name}"))
                 for pattern, name in tensor_types or []]
    qtype = _qtype(quant, known, f"--quant {quant}")
    specs.check(shape)
    out = []
    for name, sh, kind in specs.tensors(shape):
        std = 1.0 if name == "token_embd.weight" else (0.1 if kind != "w" and kind != "f32" else sh[-1] ** -0.5)
        mean = 1.0 if kind == "norm" else 0.0
        q = next((t for rx, t in overrides if rx.search(name)), qtype)
        out.append((name, sh, tensor_type(q, sh, kind), std, mean))
    return Plan(shape, qtype, out)


def _qtype(name: str, known: dict[str, Q], option: str) -> Q:
    if name not in known:
        more = "" if known is ANY_TYPE else " (any ggml type with --sparse; others through llama-quantize)"
        raise ValueError(f"could not make a model with {option}: supported types are {', '.join(known)}{more}")
    return known[name]


def layers_for_size(shape: Shape, quant: str, size_bytes: int, tensor_types: list[tuple[str, str]] | None = None,
                    sparse: bool = False) -> int:
    """The layer count whose file is closest to size_bytes without exceeding it (at least 1)."""
    one = plan(shape.replace(n_layer=shape.n_layer_dense_lead + 1), quant, tensor_types, sparse).nbytes
    two = plan(shape.replace(n_layer=shape.n_layer_dense_lead + 2), quant, tensor_types, sparse).nbytes
    per_layer, fixed = two - one, one - (two - one)
    return max(shape.n_layer_dense_lead + 1, (size_bytes - fixed) // per_layer)


def file_type(qtype: Q) -> int:
    """general.file_type for a model mostly of qtype: llama.cpp reads a llama_ftype there, not the GGML type's number
    (written before session 24: llama-bench called a Q8_0 file "Q5_0"); the K-quants as their _M mixes."""
    special = {"F32": "ALL_F32", "Q3_K": "MOSTLY_Q3_K_M", "Q4_K": "MOSTLY_Q4_K_M", "Q5_K": "MOSTLY_Q5_K_M",
               "MXFP4": "MOSTLY_MXFP4_MOE"}
    return int(LlamaFileType[special.get(qtype.name, f"MOSTLY_{qtype.name}")])


def _add_metadata(w: GGUFWriter, p: Plan, name: str) -> None:
    w.add_name(name)
    w.add_file_type(file_type(p.qtype))
    for key, value, vtype in specs.metadata(p.shape):
        w.add_key_value(key, value, vtype)
    tok = make_tokenizer(p.shape.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tok.tokens)
    w.add_token_types(tok.types)
    w.add_token_merges(tok.merges)
    w.add_eos_token_id(tok.eos_id)
    w.add_bos_token_id(tok.bos_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


class _Chunked:
    """What GGUFWriter.write_tensor_data needs (nbytes, tofile) over generated chunks."""

    def __init__(self, chunks, nbytes: int, progress: Callable[[int], None]):
        self.chunks, self.nbytes, self.progress = chunks, nbytes, progress

    def tofile(self, f) -> None:
        for c in self.chunks:
            c.tofile(f)
            self.progress(c.nbytes)


class _Hole:
    """A tensor's bytes left unwritten: the file grows past them without allocating disk."""

    def __init__(self, nbytes: int, progress: Callable[[int], None]):
        self.nbytes, self.progress = nbytes, progress

    def tofile(self, f) -> None:
        f.seek(self.nbytes, os.SEEK_CUR)
        f.truncate()  # extend to here: a hole, read back as zeros
        self.progress(self.nbytes)


def write_model(out: str | os.PathLike, p: Plan, seed: int = 0, split_max_bytes: int = 0,
                progress: Progress | None = None, name: str = "sparkd-random",
                sparse: bool = False) -> list[Path]:
    """Write the plan's GGUF (or shards when split_max_bytes is set); returns the written paths.
    sparse: header and tensor table only, every tensor's data a hole (see the module doc)."""
    out = Path(out)
    w = GGUFWriter(out, p.shape.arch, split_max_size=split_max_bytes)
    _add_metadata(w, p, name)
    for tname, sh, q, _, _ in p.tensors:
        w.add_tensor_info(tname, _ggml_byte_shape(sh, q), np.dtype(np.uint8),
                          blocks.tensor_nbytes(q, math.prod(sh)), raw_dtype=q)
    paths = [Path(x) for x in w.format_shard_names(out)]
    rng = np.random.default_rng(seed)
    total, done = p.nbytes, 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, total)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for tname, sh, q, std, mean in p.tensors:
            n = math.prod(sh)
            nbytes = blocks.tensor_nbytes(q, n)
            if sparse:
                w.write_tensor_data(_Hole(nbytes, tick))
                continue
            chunks = (blocks.random_ids(rng, sh, p.shape.n_expert) if q == Q.I32
                      else blocks.random_chunks(rng, q, n, std, mean))
            w.write_tensor_data(_Chunked(chunks, nbytes, tick))
        w.close()
    except BaseException:
        w.close()
        for path in paths:
            path.unlink(missing_ok=True)  # never leave a half-written model behind
        raise
    return paths


def _ggml_byte_shape(shape: tuple[int, ...], q: Q) -> tuple[int, ...]:
    """GGUFWriter wants uint8 data shapes in bytes per row (it converts back to elements)."""
    bs, ts = blocks.GGML_QUANT_SIZES[q]
    return (*shape[:-1], shape[-1] // bs * ts)


def requantize(llama_quantize: str | os.PathLike, src: Path, dst: Path, qtype: str) -> None:
    """Hook: produce types we do not generate (IQ*, exact K-quants) with llama.cpp's tool."""
    res = subprocess.run([str(llama_quantize), str(src), str(dst), qtype], capture_output=True, text=True)
    if res.returncode != 0:
        dst.unlink(missing_ok=True)
        raise RuntimeError(f"could not quantize {src} to {qtype} with {llama_quantize}: "
                           f"{res.stderr.strip()[-500:]}")
