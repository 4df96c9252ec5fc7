"""Named access to a GGUF model's resident tensors for the architecture builders."""

from __future__ import annotations

import math
import re
from typing import Callable

import torch
from gguf.constants import GGMLQuantizationType

from sparkd.engine import switches
from sparkd.engine.errors import EngineError
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.layers.act_round import vec_dot_format
from sparkd.engine.layers.embedding import KernelEmbedding
from sparkd.engine.layers.linear import KernelLinear, Linear
from sparkd.engine.layers.norm import RMSNorm
from sparkd.engine.layers.qlinear import QuantLinear, QuantRows, Scratch
from sparkd.engine.models.staging import DeviceStager
from sparkd.engine.tensors import load_tensor, raw_tensor

_FLOAT_TYPES = {GGMLQuantizationType.F32, GGMLQuantizationType.F64}
# 3-D resident weights kept as their blocks on the GPU path (Weights.stacked): MLA's per-head k and v matrices
STACKED_WEIGHT = re.compile(r"blk\.\d+\.attn_[kv]_b\.weight")
# how a resident Q8_0 projection is kept for the kernels: "packed" (kernels/q8_0_packed.py, 128-bit
# loads; the default) or "gguf" (the file's 34-byte blocks, the way before session 4)
Q8_0_LAYOUT_ENV = "SPARKD_Q8_0_LAYOUT"
Q8_0_LAYOUTS = ("packed", "gguf")
# how a resident Q4_K projection is kept: "tiled" (kernels/q4_k_tiled.py: the same bytes regrouped
# by tiles of 4 rows, qs then headers; matrices whose row count is a multiple of 4; the default)
# or "gguf" (the file's 144-byte blocks, the way before session 5). Experts keep GGUF blocks here (their
# gate and up: layers/quant_experts.py's own switch).
Q4_K_LAYOUT_ENV = "SPARKD_Q4_K_LAYOUT"
Q4_K_LAYOUTS = ("tiled", "gguf")
# the same for Q6_K: "tiled" (kernels/q6_k_tiled.py: tiles of 8 rows, quants in 128-bit planes, then
# scales, then d; row counts a multiple of 8, from q6_k_tiled.MIN_VALUES values: the output head, a
# dense FFN; the default)
# or "gguf" (the 210-byte blocks, session 5)
Q6_K_LAYOUT_ENV = "SPARKD_Q6_K_LAYOUT"
Q6_K_LAYOUTS = ("tiled", "gguf")
# the same for Q4_0: "tiled" (kernels/q4_0_tiled.py: tiles of 16 rows, each row's 16-byte quant runs, then the tile's
# d; row counts a multiple of 16; the default where the integer step runs, session 26) or "gguf" (the 18-byte blocks)
Q4_0_LAYOUT_ENV = "SPARKD_Q4_0_LAYOUT"
Q4_0_LAYOUTS = ("tiled", "gguf")


class Weights:
    """kernels: projections whose type has a Triton kernel stay raw blocks multiplied by it
    (KernelLinear, the GPU path). quantized: keep projection matrices and the token embedding as
    the file's blocks dequantized per use (QuantLinear, QuantRows) instead of f32; a model
    streamed on the CPU does, so its budget goes to experts.

    stager: while set, get() and kernel projections read straight into its device and dequantize
    there (no host copy of the tensor); the loader clears it once the network is built.

    q8_0_layout: with kernels, the layout of Q8_0 projections, one of Q8_0_LAYOUTS (None: the
    environment's $SPARKD_Q8_0_LAYOUT, else "packed"); q4_k_layout the same for Q4_K
    (Q4_K_LAYOUTS, $SPARKD_Q4_K_LAYOUT, else "tiled"), q6_k_layout for Q6_K (Q6_K_LAYOUTS,
    $SPARKD_Q6_K_LAYOUT, else "tiled"), q4_0_layout for Q4_0 (Q4_0_LAYOUTS, $SPARKD_Q4_0_LAYOUT, else "tiled")."""

    def __init__(self, model: GGUFModel, on_read: Callable[[int], None] | None = None,
                 kernels: bool = False, quantized: bool = False, stager: DeviceStager | None = None,
                 q8_0_layout: str | None = None, q4_k_layout: str | None = None,
                 q6_k_layout: str | None = None, q4_0_layout: str | None = None):
        self.model = model
        self.stager = stager
        self._on_read = on_read  # called with each tensor's file bytes once it is loaded (progress)
        # weights a Triton kernel multiplies stay raw blocks (KernelLinear, the GPU path): dispatch.multiplies
        self._multiplies = kernel_rule() if kernels else None
        self.scratch = Scratch() if quantized and not kernels else None
        self._q8_0_layout = q8_0_layout
        self._q4_k_layout = q4_k_layout
        self._q6_k_layout = q6_k_layout
        self._q4_0_layout = q4_0_layout

    def has(self, name: str) -> bool:
        return name in self.model.tensors

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        t = load_tensor(self.model, name, expect_shape=shape, read=self._device_read())
        if self._on_read is not None:
            self._on_read(self.model.tensor(name).nbytes)
        return t

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.get(name) if self.has(name) else None

    def linear(self, prefix: str, shape: tuple[int, int] | None = None) -> Linear | QuantLinear | KernelLinear:
        """`prefix.weight` [out, in] and `prefix.bias` if the file has one."""
        name = f"{prefix}.weight"
        if self.has(name) and self.kept_as_blocks(name):
            raw, qtype, full = self._raw(name, shape)
            # (the choice checked here, inside the build, whose failure closes the stager and file)
            if qtype == GGMLQuantizationType.Q8_0 and resident_q8_0_layout(self._q8_0_layout) == "packed":
                raw, qtype = _packed_q8_0(raw, full)
            if qtype == GGMLQuantizationType.Q4_K and resident_q4_k_layout(self._q4_k_layout) == "tiled":
                raw, qtype = _tiled_q4_k(raw, full)
            if qtype == GGMLQuantizationType.Q6_K and resident_q6_k_layout(self._q6_k_layout) == "tiled":
                raw, qtype = _tiled_q6_k(raw, full)
            if qtype == GGMLQuantizationType.Q4_0 and resident_q4_0_layout(self._q4_0_layout) == "tiled":
                raw, qtype = _tiled_q4_0(raw, full)
            return KernelLinear(raw, qtype, full, self.maybe(f"{prefix}.bias"), self.act_format(name))
        rows = self.rows(name, shape)
        if isinstance(rows, QuantRows):
            return QuantLinear(rows, self.maybe(f"{prefix}.bias"), self.act_format(name))
        return Linear(rows, self.maybe(f"{prefix}.bias"), self.act_format(name))

    def stacked(self, name: str) -> Linear | KernelLinear:
        """A 3-D weight [G, rows, cols] (STACKED_WEIGHT: MLA's per-head matrices) as one linear of G * rows rows for
        `grouped`: the file's blocks where its type has a kernel (in the file's layout: the resident repacks would pad
        MLA's 128-wide rows), else f32. Matrix g is rows g * rows ... of it."""
        if not STACKED_WEIGHT.fullmatch(name):
            raise EngineError(f"could not load {name!r} as stacked matrices: only {STACKED_WEIGHT.pattern} are "
                              f"(streaming/plan.py counts their bytes by this rule)")
        if self.kept_as_blocks(name):
            return KernelLinear(*self._raw(name), act_fmt=self.act_format(name))
        w = self.get(name)
        return Linear(w.reshape(-1, w.shape[-1]), None, self.act_format(name))

    def embedding(self, name: str) -> torch.Tensor | QuantRows | KernelEmbedding:
        """A token embedding [V, D]: the file's blocks where its type has a kernel (KernelEmbedding: a lookup
        dequantizes its rows on the device; the GPU path), else rows() (f32, or QuantRows on a quantized load)."""
        if self.kept_as_blocks(name):
            return KernelEmbedding(*self._raw(name))
        return self.rows(name)

    def kept_as_blocks(self, name: str) -> bool:
        """Whether this load keeps the weight as the file's bytes for the kernels (streaming/plan.trunk_bytes counts
        by the same rule)."""
        info = self.model.tensor(name)
        return self._multiplies is not None and self._multiplies(info.ggml_type, info.shape[-1])

    def _raw(self, name: str, shape: tuple[int, ...] | None = None) -> tuple[torch.Tensor, object, tuple[int, int]]:
        """(bytes, type, [rows, cols]) of a weight kept as blocks; a 3-D one's matrices one after another."""
        raw, qtype, full = raw_tensor(self.model, name, shape, read=self._device_read())
        if self._on_read is not None:
            self._on_read(raw.numel())
        return raw, qtype, (math.prod(full[:-1]), full[-1])

    def rows(self, name: str, shape: tuple[int, int] | None = None) -> torch.Tensor | QuantRows:
        """A 2-D weight: f32, or QuantRows when this loader keeps weights quantized."""
        info = self.model.tensor(name)
        if self.scratch is None or info.ggml_type in _FLOAT_TYPES or len(info.shape) != 2:
            return self.get(name, shape)
        raw, ggml_type, full_shape = raw_tensor(self.model, name, shape)
        if self._on_read is not None:
            self._on_read(info.nbytes)
        return QuantRows(raw, ggml_type, full_shape, self.scratch)

    def _device_read(self):
        return None if self.stager is None else self.stager.raw

    def act_format(self, name: str) -> str | None:
        """How llama.cpp rounds the activations multiplied by this weight (see act_round)."""
        return vec_dot_format(self.model.tensor(name).ggml_type)

    def maybe_linear(self, prefix: str) -> Linear | None:
        return self.linear(prefix) if self.has(f"{prefix}.weight") else None

    def norm(self, name: str, eps: float) -> RMSNorm:
        return RMSNorm(self.get(f"{name}.weight"), eps)

    def maybe_norm(self, name: str, eps: float) -> RMSNorm | None:
        return self.norm(name, eps) if self.has(f"{name}.weight") else None


def resident_q8_0_layout(choice: str | None = None) -> str:
    """The Q8_0 layout of kernel projections: choice, else $SPARKD_Q8_0_LAYOUT, else "packed"."""
    return _layout("Q8_0", choice, Q8_0_LAYOUT_ENV, Q8_0_LAYOUTS)


def resident_q4_k_layout(choice: str | None = None) -> str:
    """The Q4_K layout of kernel projections: choice, else $SPARKD_Q4_K_LAYOUT, else "tiled"."""
    return _layout("Q4_K", choice, Q4_K_LAYOUT_ENV, Q4_K_LAYOUTS)


def resident_q6_k_layout(choice: str | None = None) -> str:
    """The Q6_K layout of kernel projections: choice, else $SPARKD_Q6_K_LAYOUT, else "tiled"."""
    return _layout("Q6_K", choice, Q6_K_LAYOUT_ENV, Q6_K_LAYOUTS)


def resident_q4_0_layout(choice: str | None = None) -> str:
    """The Q4_0 layout of kernel projections: choice, else $SPARKD_Q4_0_LAYOUT, else "tiled"."""
    return _layout("Q4_0", choice, Q4_0_LAYOUT_ENV, Q4_0_LAYOUTS)


def _layout(what: str, choice: str | None, env: str, layouts: tuple[str, ...]) -> str:
    """choice, else $env, else layouts[0] (the default), checked against layouts."""
    if choice is None:
        return switches.choice(env, layouts, layouts[0])
    layout = choice.strip().lower()
    if layout not in layouts:
        raise EngineError(f"could not choose the resident {what} layout {layout!r}: use one of "
                          f"{', '.join(layouts)} (${env})")
    return layout


def _tiled_q4_k(raw: torch.Tensor, shape: tuple[int, int]):
    """A Q4_K projection in kernels/q4_k_tiled.py's layout where its shape allows (_tiled)."""
    from sparkd.engine.kernels import q4_k_tiled  # imports triton: only on the kernel path

    return _tiled(q4_k_tiled, raw, shape, GGMLQuantizationType.Q4_K)


def _tiled_q6_k(raw: torch.Tensor, shape: tuple[int, int]):
    """A Q6_K projection in kernels/q6_k_tiled.py's layout where it pays (worth_tiling: the head)."""
    from sparkd.engine.kernels import q6_k_tiled  # imports triton: only on the kernel path

    return _tiled(q6_k_tiled, raw, shape, GGMLQuantizationType.Q6_K, q6_k_tiled.worth_tiling(shape))


def _tiled_q4_0(raw: torch.Tensor, shape: tuple[int, int]):
    """A Q4_0 projection in kernels/q4_0_tiled.py's layout where its shape allows and its integer step runs (the
    layout's step is; $SPARKD_Q4_0_INT=0 keeps the file's blocks)."""
    from sparkd.engine.kernels import q4_0_tiled  # imports triton: only on the kernel path

    return _tiled(q4_0_tiled, raw, shape, GGMLQuantizationType.Q4_0, q4_0_tiled.FAMILY.idot is not None)


def _tiled(layout, raw: torch.Tensor, shape: tuple[int, int], qtype: GGMLQuantizationType, wanted: bool = True):
    """A projection's blocks in a tiled layout module's bytes and its qtype, or as they are (qtype)
    when its row count is not whole tiles or it is not wanted (the same bytes either way)."""
    if not (wanted and layout.packable(shape)):
        return raw, qtype
    return layout.pack_raw(raw, shape), layout.TILED


def _packed_q8_0(raw: torch.Tensor, shape: tuple[int, int]):
    """A Q8_0 projection's blocks in the packed layout, and its qtype for the kernels."""
    from sparkd.engine.kernels import q8_0_packed  # imports triton: only on the kernel path

    return q8_0_packed.pack_raw(raw, shape), q8_0_packed.PACKED


def kernel_rule() -> Callable[[GGMLQuantizationType, int], bool]:
    """Which tensors the GPU kernels multiply from their file blocks (dispatch.multiplies: qtype, columns): the loader's
    rule and the memory plan's (streaming/plan.py) on a GPU."""
    from sparkd.engine.kernels.dispatch import multiplies  # imports triton: only on the kernel path

    return multiplies
