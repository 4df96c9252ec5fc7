"""Linear projections: over a resident float weight (Linear), or straight from raw GGUF blocks
through the Triton kernels (KernelLinear, the GPU path). KernelLinear.stack puts projections of
one input (q, k, v) in one matrix of their rows: one x quantization and one GEMV launch."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from sparkd.engine import switches
from sparkd.engine.kernels import PRECISIONS, SLAB_TYPES
from sparkd.engine.layers.act_round import round_activations

# tl.dot's input precision in the prefill GEMMs (dense and MoE; kernels.PRECISIONS): "int8" (default, session 9) the
# integer GEMM (x as int8 blocks, the decode's integer sums) where the weights' family has one (prefill_gemm.int_gemm:
# Q8_0, Q4_K, Q6_K and their default resident layouts, Q4_0, IQ4_XS, the grid i-quants), "tf32" for F16 and BF16 (their
# values and x rounded to them are tf32 values: exact products; prefill_gemm.float_precision), "ieee" for the others;
# "ieee" float32 FMAs everywhere (the way before), "tf32x3" three tf32 products on the tensor cores, "tf32" one
PREFILL_PRECISION = switches.choice("SPARKD_PREFILL_PRECISION", PRECISIONS, "int8")
# a stack's integer GEMM (several tokens): "one" launch over all its rows (session 10; the same bits:
# each output's block sums do not depend on its row's place in a tile), "parts" a launch per part
PREFILL_STACK = switches.choice("SPARKD_PREFILL_STACK", ("one", "parts"), "one")
# a float Linear over several rows on CUDA (the router's F32 gate, an F16/F32 projection): "torch"
# (default) cuBLAS, whose kernel and summation order follow the row count; "kernel" (session 11,
# attn11) kernels/float_gemm's fixed tiles, each row's bits whatever the row count (a prompt padded
# to its graph bucket keeps the eager prompt's bits), 0.15 ms a gate on the H200 against cuBLAS's 0.02
PREFILL_FLOAT_GEMM = switches.choice("SPARKD_PREFILL_FLOAT_GEMM", ("kernel", "torch"), "torch")
# an F16 / BF16 KernelLinear over several rows (a prompt's): "torch" (session 37) cuBLAS's float32 GEMM over
# the values widened for the call, the product the f32 weights had before session 36 (H200, a 4-layer gpt-oss-20b F16
# file: the Triton GEMM at tf32 took its 2000-token prompt from 20.9k to 13.2k tok/s); "kernel" prefill_gemm's;
# "half" (default, session 42; the CPU widens them as "torch") cuBLAS on the 16-bit values themselves, x rounded to
# them: the tensor cores' exact products summed in float32 into a float32 result (torch.mm's out_dtype), not the
# widened copy's FMAs (H100, that file's 8000-token prompt 36.2k -> 40.7k tok/s, its projections 33 -> 2.3 ms)
HALF_PROMPT = switches.choice("SPARKD_HALF_PROMPT", ("torch", "half", "kernel"), "half")
HALF_VALUES = {"F16": torch.float16, "BF16": torch.bfloat16}  # the 16-bit types the files keep unquantized
# a quantized KernelLinear over SLAB_MIN_ROWS rows or more on CUDA (a long prompt's, session 46; a MoE layer's experts:
# layers/moe.py's SLAB_EXPERT_ROWS): "bf16" (default) kernels/slab_gemm, the blocks dequantized a slab of rows at a
# time and cuBLAS on the 16-bit values, x rounded to them; "f16" the same in float16 (finer, float16's range); "off" the
# GEMM above (PREFILL_PRECISION) at every row count, as under PREFILL_FLOAT_GEMM "kernel" (whose promise, a row's bits
# whatever the row count, cuBLAS does not keep). H100, DeepSeek V3's dense shapes at 512 rows: 0.86-5.6x the
# integer GEMM, 3.0-10.5x at 8000 (docs/performance.md, session 46)
SLAB_GEMM = switches.choice("SPARKD_SLAB_GEMM", (*SLAB_TYPES, "off"), "bf16")
SLAB_MIN_ROWS = 512


def slab_type(device: torch.device) -> torch.dtype | None:
    """The 16-bit type a prompt's quantized GEMMs on device run in through kernels/slab_gemm (SLAB_GEMM), or None: the
    integer or float GEMM (the CPU, SLAB_GEMM "off", PREFILL_FLOAT_GEMM "kernel"). Rows are the caller's to count."""
    if SLAB_GEMM == "off" or PREFILL_FLOAT_GEMM == "kernel" or torch.device(device).type != "cuda":
        return None
    return SLAB_TYPES[SLAB_GEMM]


class Linear(nn.Module):
    """y = round(x) @ W.T + b, with x rounded as llama.cpp's matmul for W's file type does
    (act_fmt, see act_round; None keeps f32 activations)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 act_fmt: str | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [out, in]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.act_fmt = act_fmt

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = round_activations(x, self.act_fmt)
        if (PREFILL_FLOAT_GEMM == "kernel" and x.is_cuda and x.dim() == 2 and x.shape[0] > 1
                and x.dtype == torch.float32 and self.weight.stride(-1) == 1):
            from sparkd.engine.kernels.float_gemm import float_gemm

            return float_gemm(x.contiguous(), self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def grouped(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, G, in]: the rows as G stacked matrices, matrix g times x[:, g] → [T, G, out / G] (no bias: the
        layers that call it have none)."""
        T, G, cols = x.shape
        return torch.einsum("tgi,gri->tgr", round_activations(x, self.act_fmt), self.weight.view(G, -1, cols))

    def dense(self) -> torch.Tensor:
        """W float32 [out, in] (KernelLinear's dequantizes it)."""
        return self.weight


class KernelLinear(nn.Module):
    """y = round(x) @ W.T + b with W kept as its raw GGUF blocks and multiplied by the Triton
    kernels (sparkd.engine.kernels): the GEMV for one token, the GEMM (PREFILL_PRECISION) for
    several. The blocks live where the module is moved (a CUDA device; on the CPU only under
    TRITON_INTERPRET=1, for tests).

    parts: for a stack (KernelLinear.stack), the row counts of the stacked projections; their
    GEMV then runs with the split-K split each part alone gets (matmul.split_for), so every row
    is summed as the part alone sums it (the same bits)."""

    def __init__(self, raw: torch.Tensor, qtype, shape: tuple[int, int], bias: torch.Tensor | None = None,
                 act_fmt: str | None = None, parts: tuple[int, ...] | None = None):
        super().__init__()
        self.register_buffer("raw", raw)  # uint8 GGUF blocks of W [out, in]
        self.qtype, self.shape = qtype, tuple(shape)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.act_fmt = act_fmt
        self.parts = tuple(parts) if parts else (self.shape[0],)
        self._gemv_configs: dict[bool, tuple] = {}  # _gemv_config's, per device kind

    @classmethod
    def stack(cls, layers: list[nn.Module]) -> KernelLinear | None:
        """One KernelLinear over the rows of `layers` one after another (a row's bytes do not
        depend on its neighbours: the stack is exact), or None when they cannot share one: not all
        KernelLinear, or different types, input widths, activation rounding, devices, or some
        with a bias and some without."""
        if not all(type(m) is KernelLinear and len(m.parts) == 1 for m in layers):
            return None
        first = layers[0]
        same = {(m.qtype, m.shape[1], m.act_fmt, m.raw.device, m.bias is None) for m in layers}
        if len(same) != 1:
            return None
        bias = None if first.bias is None else torch.cat([m.bias for m in layers])
        rows = tuple(m.shape[0] for m in layers)
        return cls(torch.cat([m.raw.reshape(-1) for m in layers]), first.qtype, (sum(rows), first.shape[1]),
                   bias, first.act_fmt, rows)

    @property
    def out_features(self) -> int:
        return self.shape[0]

    def _round(self, x: torch.Tensor) -> torch.Tensor:
        return round_activations(x, self.act_fmt)

    def x_format(self) -> str | None:
        """The int8 block format the GEMV quantizes x to (act_quant.Q8_0 / Q8_K), None for a
        family without an integer step: what a norm feeding this projection may write for it."""
        from sparkd.engine.kernels import dispatch

        fam = dispatch.family(self.qtype)
        return fam.act_fmt if fam.idot is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        h = x.reshape(-1, self.shape[1]).float().contiguous()
        if h.shape[0] == 1:
            y = self._gemv(h[0], self._quantized(x))[None]
        elif (dtype := self._slab(h)) is not None:
            from sparkd.engine.kernels.slab_gemm import slab_gemm

            y = slab_gemm(self.raw, self.qtype, self.shape, h, dtype)
        else:
            qx = self._gemm_qx(h)  # the integer GEMM: x quantized once, for every part
            if qx is not None and (len(self.parts) == 1 or PREFILL_STACK == "one"):
                y = self._gemm(h, qx=qx)  # the whole stack in one launch
            else:  # a float GEMM tile's arithmetic may depend on a row's place in it: part by part
                hr = h if qx is not None else self._round(h).contiguous()
                y = torch.cat([self._gemm(hr, *self._span(i), qx) for i in range(len(self.parts))], dim=1)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.shape[0])

    def forward_parts(self, x: torch.Tensor) -> torch.Tensor:
        """One token x [1, in] -> [S, out] whose rows added in order (matmul.sum_parts) are forward(x)'s
        row: the GEMV's split-K partials left for the launch that reads them next (S 1 where the
        GEMV has no ordered split, or this layer is not one bias-free launch: that row is y itself)."""
        cfg, one_launch = self._gemv_config(x.is_cuda)
        if x.numel() == self.shape[1] and self.bias is None and one_launch:
            from sparkd.engine.kernels.matmul import gemv

            h = x.reshape(self.shape[1]).float().contiguous()
            return gemv(self.raw, self.qtype, self.shape, h, config=cfg, round_x=self._round, qx=self._quantized(x),
                        parts=True)
        return self.forward(x).reshape(1, self.shape[0])

    def grouped(self, x: torch.Tensor) -> torch.Tensor:
        """Linear.grouped through the kernels: a token in one grouped GEMV launch (matmul.gemv's groups) where a
        program's rows fit in a group, else a GEMV or GEMM per group."""
        from sparkd.engine.kernels import dispatch
        from sparkd.engine.kernels.matmul import gemv, grouped_config, grouped_tile_fits

        T, G, cols = x.shape
        R = self.shape[0] // G
        h = x.float()
        if T == 1:
            cfg = grouped_config(dispatch.family(self.qtype), self._gemv_config(x.is_cuda)[0], cols, R, x.is_cuda)
            if grouped_tile_fits(cfg, R):
                return gemv(self.raw, self.qtype, self.shape, h[0].contiguous(), config=cfg,
                            round_x=self._round).view(1, G, R)
            return torch.stack([gemv(*self._rows(g * R, R), h[0, g].contiguous(), config=cfg, round_x=self._round)
                                for g in range(G)])[None]
        outs = []
        for g in range(G):
            hg = h[:, g].contiguous()
            qx = self._gemm_qx(hg)
            outs.append(self._gemm(hg if qx is not None else self._round(hg).contiguous(), g * R, R, qx))
        return torch.stack(outs, dim=1)

    def dense(self) -> torch.Tensor:
        """W dequantized: float32 [out, in] on the blocks' device, a new tensor per call (for products the kernels do
        not run: MLA's prompt contracts its k matrices along their rows)."""
        from sparkd.engine.kernels.dequantize import dequantize

        return dequantize(self.raw, self.qtype, self.shape)

    def _quantized(self, x: torch.Tensor):
        """x's QuantX in this GEMV's format if the norm that made x wrote one (act_quant.attach)."""
        if x.dtype != torch.float32 or x.numel() != self.shape[1]:
            return None
        from sparkd.engine.kernels import act_quant

        return act_quant.attached(x, self.x_format())

    def _gemv(self, x: torch.Tensor, qx=None) -> torch.Tensor:
        from sparkd.engine.kernels.matmul import gemv

        cfg, one_launch = self._gemv_config(x.is_cuda)
        if one_launch:  # integer kernels (Family.idot) quantize x themselves (or take qx), as round_x would
            return gemv(self.raw, self.qtype, self.shape, x, config=cfg, round_x=self._round, qx=qx)
        # parts on both sides of split_for's threshold: one launch would change some rows' sums
        return torch.cat([gemv(*self._part(i), x, config=cfg, round_x=self._round, qx=qx)
                          for i in range(len(self.parts))])

    def _gemv_config(self, on_cuda: bool) -> tuple:
        """(tile, whether the parts share one launch), worked out on a device's first call: the
        decode path calls every projection once per token."""
        if on_cuda not in self._gemv_configs:
            from sparkd.engine.kernels import dispatch
            from sparkd.engine.kernels.matmul import GemvConfig, default_config, split_for

            # the interpreter (CPU, tests) runs programs one by one: few, wide tiles (where the step allows)
            fam = dispatch.family(self.qtype)
            cfg = default_config(fam) if on_cuda or fam.one_tile else GemvConfig(block_n=64)
            groups = -(-self.shape[1] // (fam.nsub * fam.sublen))  # as gemv counts them
            splits = {split_for(cfg, rows, groups, self.raw.device) for rows in self.parts}
            one_launch = len(splits) == 1
            self._gemv_configs[on_cuda] = (dataclasses.replace(cfg, split=splits.pop()) if one_launch else cfg,
                                           one_launch)
        return self._gemv_configs[on_cuda]

    def _slab(self, h: torch.Tensor) -> torch.dtype | None:
        """The 16-bit type h's GEMM runs slab_gemm in (slab_type) where the blocks are quantized and h a long prompt's
        rows, else None."""
        if h.shape[0] < SLAB_MIN_ROWS or self.qtype.name in HALF_VALUES:
            return None
        return slab_type(h.device)

    def _gemm_qx(self, h: torch.Tensor):
        """h's QuantX where the GEMM runs integer (prefill_gemm.int_gemm), else None."""
        from sparkd.engine.kernels import act_quant, dispatch
        from sparkd.engine.kernels.prefill_gemm import int_gemm

        fam = dispatch.family(self.qtype)
        return act_quant.quantize(h, fam.act_fmt) if int_gemm(fam, PREFILL_PRECISION) else None

    def _gemm(self, h: torch.Tensor, first: int | None = None, rows: int | None = None, qx=None) -> torch.Tensor:
        """The GEMM of rows [first, first + rows) (None: all of the matrix's)."""
        from sparkd.engine.kernels.prefill_gemm import gemm

        raw, qtype, shape = (self.raw, self.qtype, self.shape) if first is None else self._rows(first, rows)
        if qx is None and qtype.name in HALF_VALUES and HALF_PROMPT != "kernel":  # (h rounded to the type already)
            w = raw.view(HALF_VALUES[qtype.name]).view(shape)
            if HALF_PROMPT == "half" and h.is_cuda:
                return torch.mm(h.to(w.dtype), w.T, out_dtype=torch.float32)
            return F.linear(h, w.float())
        return gemm(raw, qtype, shape, h, precision=PREFILL_PRECISION, qx=qx)

    def _span(self, i: int) -> tuple[int, int]:
        """(first row, rows) of stacked part i (the whole matrix when not a stack)."""
        return sum(self.parts[:i]), self.parts[i]

    def _part(self, i: int) -> tuple[torch.Tensor, object, tuple[int, int]]:
        """(raw bytes, qtype, shape) of stacked part i."""
        return self._rows(*self._span(i))

    def _rows(self, first: int, rows: int) -> tuple[torch.Tensor, object, tuple[int, int]]:
        """(raw bytes, qtype, shape) of rows [first, first + rows) (a tiled layout's: whole tiles)."""
        row_bytes = self.raw.numel() // self.shape[0]
        return self.raw[first * row_bytes:(first + rows) * row_bytes], self.qtype, (rows, self.shape[1])
