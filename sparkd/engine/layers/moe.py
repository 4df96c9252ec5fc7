"""MoE router (llama.cpp's build_moe_ffn selection) and the routed-expert block."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from sparkd.engine import switches
from sparkd.engine.kernels import fused
from sparkd.engine.layers.act_round import round_activations
from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.layers.ffn import ACTIVATIONS, Activation, kernel_act
from sparkd.engine.layers import linear
from sparkd.engine.layers.linear import Linear

# llama.cpp's gating function ids (gguf.ExpertGatingFuncType has 1 and 2; 3 is internal to llama.cpp).
GATING_SOFTMAX = "softmax"
GATING_SIGMOID = "sigmoid"
GATING_SOFTMAX_WEIGHT = "softmax_weight"  # gpt-oss: softmax over the selected logits only
GATING_SQRT_SOFTPLUS = "sqrt_softplus"  # DeepSeek V4: sqrt(softplus(logits))

# llama.cpp clamps the sum of routing weights to the smallest normal f16 before dividing
_MIN_WEIGHT_SUM = 6.103515625e-5

# What the fused MoE decode does in its two launches instead of torch around them, each switchable
# back (SPARKD_MOE_DECODE: "all", the default, "none" or some of these, read once): "ids" the
# kernels read offsets[ids] (else a gathering launch per offset table), "fold" a split down's
# ranges meet in the down launch (else a torch.sum launch), "residual" the block's residual add
# in the down launch (else a torch add), "quant_h" integer families' h quantized in the gate/up
# launch (GemvConfig.fuse_quant; else its own launch), "router" the router's gate GEMV in its
# top-k launch (one token, float32 gate; else a torch matmul before it; the logits' bits differ).
DECODE_PARTS = ("ids", "fold", "residual", "quant_h", "router")
DECODE_ENV = "SPARKD_MOE_DECODE"


def decode_parts(spec: str) -> frozenset[str]:
    """"all", "none"/"" or names of DECODE_PARTS separated by commas → the parts switched on."""
    return switches.parse_names(spec, DECODE_PARTS, "the MoE decode parts", DECODE_ENV)


DECODE_ON: frozenset[str] = switches.names(DECODE_ENV, DECODE_PARTS, "the MoE decode parts")

# moe_prefill's host check of the slots' range (a sync a layer): "router" (session 10) only for
# slots not picked by the layer's own router among the table's experts (a top-k over its logits
# cannot leave them, router_topk's neither, NaN logits included), "always" for every layer, as before
SLOT_CHECK = switches.choice("SPARKD_MOE_SLOT_CHECK", ("router", "always"), "router")
# a prompt's quantized experts (not F16 / BF16 ones, whose values bfloat16 would round) through 16-bit slabs
# (moe_prefill's slab; SPARKD_SLAB_GEMM's type) where the layer's rows per expert (tokens times experts a token over
# the table's experts) reach this: each call pays a copy of every expert's weights' values, the grouped GEMMs' speed
# pays it back from ~40 rows an expert. Session 47, H100, one layer (bench/moe_slab_bench.py), slabs / integer GEMMs:
# Qwen3-30B-A3B's experts 0.92x at 32 rows, 1.25x at 62.5, 1.81x at 125, 3.3x at 500; gpt-oss-20b's 0.92x at 32,
# 1.28x at 64, 3.2x at 1000; DeepSeek V3's 256 0.76x at 31, 1.28x at 62.5, 3.3x at 250. (Session 46's per-expert
# slabs, ~25 launches an expert, needed 512.)
SLAB_EXPERT_ROWS = 64
# where torch._grouped_mm has no fused kernel (torch >= 2.9 runs a mm an expert after a host sync: compute capability
# 8.x and 12.x, the GB10's 12.1 among them, and float16 slabs anywhere), the slabs cost session 46's launches an
# expert: its measured threshold (H100, gpt-oss-20b at 250 rows an expert 43 -> 85-110 ms, at 1000 143 -> 77-87)
SLAB_EXPERT_ROWS_LOOPED = 512


def slab_expert_rows(device: torch.device | str) -> int | None:
    """The rows an expert from which a prompt's MoE layers on device take the slabs (SLAB_EXPERT_ROWS where
    torch._grouped_mm runs fused, SLAB_EXPERT_ROWS_LOOPED elsewhere), or None: no slabs there (linear.slab_type).
    Without a GPU to ask (a plan's tests) SLAB_EXPERT_ROWS: the fewer rows, the more the plan reserves."""
    dtype = linear.slab_type(torch.device(device))
    if dtype is None:
        return None
    if not torch.cuda.is_available():
        return SLAB_EXPERT_ROWS
    fused = dtype == torch.bfloat16 and torch.cuda.get_device_capability(device)[0] in (9, 10)
    return SLAB_EXPERT_ROWS if fused else SLAB_EXPERT_ROWS_LOOPED


class Router(nn.Module):
    """Scores experts and picks top-k per token.

    Selection may add a bias (DeepSeek V3's e_score_correction) and restrict to the best groups
    (a group's score is the sum of its two best experts); the weights come from the unbiased
    probabilities, optionally renormalised over the selected experts and scaled.
    """

    def __init__(self, gate: Linear, top_k: int, gating: str = GATING_SOFTMAX,
                 norm_w: bool = False, scale: float = 0.0, sel_bias: torch.Tensor | None = None,
                 n_groups: int = 0, n_group_used: int = 0):
        super().__init__()
        self.gate, self.top_k, self.gating = gate, top_k, gating
        self.norm_w, self.scale = norm_w, scale
        self.sel_bias = None if sel_bias is None else nn.Parameter(sel_bias, requires_grad=False)
        self.n_groups, self.n_group_used = n_groups, n_group_used

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [T, D] → weights [T, A], ids [T, A]; given ids (hash routing) skip the selection
        if ids is None and self._fits_gate_kernel(x):
            from sparkd.engine.kernels.router_topk import gate_topk

            return gate_topk(self.gate.weight, x, self.top_k, self.gating, self.norm_w, self.scale,
                             _MIN_WEIGHT_SUM, self.sel_bias)
        logits = self.gate(x)  # [T, E]
        if ids is None and self._fits_kernel(logits):
            from sparkd.engine.kernels.router_topk import router_topk

            return router_topk(logits, self.top_k, self.gating, self.norm_w, self.scale,
                               _MIN_WEIGHT_SUM, self.sel_bias)
        if self.gating == GATING_SOFTMAX:
            probs = torch.softmax(logits, dim=-1)
        elif self.gating == GATING_SIGMOID:
            probs = torch.sigmoid(logits)
        elif self.gating == GATING_SQRT_SOFTPLUS:
            probs = torch.sqrt(torch.nn.functional.softplus(logits))
        else:
            probs = logits
        sel = probs if self.sel_bias is None else probs + self.sel_bias
        if self.n_groups > 1:
            sel = self._mask_groups(sel)
        if ids is None:
            ids = torch.topk(sel, self.top_k, dim=-1).indices  # [T, A]
        w = probs.gather(-1, ids)
        if self.gating == GATING_SOFTMAX_WEIGHT:
            w = torch.softmax(w, dim=-1)
        if self.norm_w:
            w = w / w.sum(-1, keepdim=True).clamp(min=_MIN_WEIGHT_SUM)
        if self.scale not in (0.0, 1.0):
            w = w * self.scale
        return w, ids

    def _fits_kernel(self, logits: torch.Tensor, E: int | None = None) -> bool:
        """Whether router_topk does this selection (one launch for ~10 torch kernels): no group
        limit, top-k <= 16, float32 logits (or E of them computed on this tensor's device), and
        the switch on."""
        if not fused.active("router", logits):
            return False  # before the import: the CPU engine runs without Triton
        from sparkd.engine.kernels.router_topk import GATINGS, MAX_EXPERTS, MAX_TOP_K

        E = logits.shape[-1] if E is None else E
        return (self.n_groups <= 1 and self.top_k <= min(E, MAX_TOP_K) and E <= MAX_EXPERTS
                and logits.dtype == torch.float32 and self.gating in GATINGS
                and (self.sel_bias is None or self.sel_bias.dtype == torch.float32))

    def _fits_gate_kernel(self, x: torch.Tensor) -> bool:
        """Whether gate_topk runs the gate GEMV and the selection in one launch: one token, a
        float32 gate without bias or activation rounding, where router_topk would select, and
        the "router" part of DECODE_ON on."""
        g = self.gate
        if "router" not in DECODE_ON or x.dim() != 2 or x.shape[0] != 1 or type(g) is not Linear:
            return False
        w = g.weight
        return (g.bias is None and g.act_fmt is None and w.dtype == x.dtype == torch.float32 and w.dim() == 2
                and w.is_contiguous() and x.stride(-1) == 1 and w.device == x.device
                and self._fits_kernel(x, w.shape[0]))

    def _mask_groups(self, sel: torch.Tensor) -> torch.Tensor:
        T, E = sel.shape
        groups = sel.view(T, self.n_groups, E // self.n_groups)  # [T, G, E/G]
        group_score = groups.topk(2, dim=-1).values.sum(-1)  # [T, G]
        keep = group_score.topk(self.n_group_used, dim=-1).indices  # [T, Gu]
        mask = torch.ones(T, self.n_groups, dtype=torch.bool, device=sel.device).scatter_(1, keep, False)
        return groups.masked_fill(mask[..., None], float("-inf")).view(T, E)


class MoE(nn.Module):
    """Routed experts (from an ExpertStore) plus optional always-on shared experts.

    A store with `kernel_select` (KernelExperts; StreamingExperts zero-copy from its pinned arena)
    runs the layer through the Triton MoE kernels straight from raw blocks: a token at a time by
    the fused decode kernels, or tokens grouped by expert where the store has `kernel_table`."""

    def __init__(self, il: int, router: Router, store: ExpertStore, act: str | Activation = "silu",
                 shared: nn.Module | None = None):
        super().__init__()
        self.il, self.router, self.store, self.shared = il, router, store, shared
        self.act = ACTIVATIONS[act] if isinstance(act, str) else act
        self.kernel_act = kernel_act(act)  # the activation as the kernels fuse it; None: the torch path

    @property
    def takes_residual(self) -> bool:
        """Whether forward may be handed the block's residual (nothing between the routed sum and
        the add: no shared experts) and the switch is on."""
        return self.shared is None and "residual" in DECODE_ON

    def x_format(self) -> str | None:
        """The int8 block format the fused decode kernels quantize x to (None: they do not run here
        or multiply floats): the format the norm before this layer may write x's blocks in."""
        store_format = getattr(self.store, "x_format", None)
        if store_format is None or self.kernel_act is None:
            return None
        return store_format(self.il)

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None,
                residual: torch.Tensor | None = None,
                routing: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The layer's output [T, D]; given residual [T, D] (takes_residual), residual + it, the
        same bits, added inside the fused decode's down launch where that runs. routing: the
        router's (weights, ids) of x, already computed (a streamed step's graph segment ran it)."""
        if residual is not None and self.shared is not None:
            raise ValueError(f"could not add the residual inside MoE layer {self.il}: it has shared experts "
                             f"(pass residual only where takes_residual is true; add it after the layer)")
        # [T, A], [T, A]; ids given: fixed (hash) routing
        picked = ids is None  # by the router, over its gate's outputs
        w, ids = self.router(x, ids) if routing is None else routing
        if self.kernel_act is not None and hasattr(self.store, "kernel_select"):
            out = self._kernels(x, w.float().contiguous(), ids, residual, picked)
            if out is not None:
                return out if self.shared is None else out + self.shared(x)
        out, shared = self.routed(x, w, ids, x)
        out = out if shared is None else out + shared
        return out if residual is None else residual + out

    def _kernels(self, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor,
                 residual: torch.Tensor | None = None, picked: bool = False) -> torch.Tensor | None:
        """The layer through the Triton MoE kernels; None where the store cannot serve them.
        Triton is imported only once a store serves kernels: the CPU engine runs without it.
        picked: ids are the router's top-k (in range where its gate has one output per expert)."""
        table = getattr(self.store, "kernel_table", None)
        layer = table(self.il) if table is not None and x.shape[0] > 1 else None
        if layer is not None:  # many tokens, every expert at hand: group tokens by expert
            from sparkd.engine.kernels.prefill_gemm import int_gemm
            from sparkd.engine.kernels.moe_prefill import moe_prefill

            # the integer GEMM quantizes x itself (to the values round_activations gives)
            int_gu = int_gemm(layer.prepared.gate_up, linear.PREFILL_PRECISION)
            h = (x if int_gu else round_activations(x, layer.act_gate)).float().contiguous()
            n = layer.prepared.gate_off.numel()
            in_range = picked and getattr(self.router.gate, "out_features", None) == n
            slab = self._slab(layer, x.shape[0], x.device)
            if slab is not None and torch.cuda.is_current_stream_capturing():
                slab = None  # a graph keeps the grouped GEMMs: the slabs' scratch would stay in its pool
            out = moe_prefill(layer.prepared, h, ids, w, self.kernel_act, linear.PREFILL_PRECISION,
                              _rounder(layer.act_down), check_slots=SLOT_CHECK == "always" or not in_range,
                              bias=layer.bias, slab=slab)
            return out if residual is None else residual + out
        rows = []
        for t in range(x.shape[0]):  # one token at a time through the fused decode kernels
            sel = self.store.kernel_select(self.il, ids[t])
            if sel is None:
                return None
            rows.append(self.decode_selected(sel, x, w, residual, t))
        return rows[0][None] if len(rows) == 1 else torch.stack(rows)  # decode: no copy

    def slab_experts(self, tokens: int, device: torch.device) -> torch.dtype | None:
        """The 16-bit type a prompt of `tokens` tokens on device runs this layer's experts in (moe_prefill's slab:
        linear.slab_type's, for quantized experts of a kernel table, from SLAB_EXPERT_ROWS rows an expert, or
        SLAB_EXPERT_ROWS_LOOPED where torch._grouped_mm has no fused kernel), or None: the grouped GEMMs, or no kernel
        table."""
        table = getattr(self.store, "kernel_table", None)
        layer = table(self.il) if table is not None and self.kernel_act is not None and tokens > 1 else None
        return None if layer is None else self._slab(layer, tokens, device)

    def _slab(self, layer, tokens: int, device: torch.device) -> torch.dtype | None:
        """slab_experts for the layer's kernel table `layer` (a KernelLayer)."""
        p = layer.prepared
        rows = slab_expert_rows(device)
        if rows is None or {p.gate_up.qtype.name, p.down.qtype.name} & set(linear.HALF_VALUES):
            return None  # F16 / BF16 experts: bfloat16 would round their values
        return linear.slab_type(device) if tokens * self.router.top_k >= rows * p.gate_off.numel() else None

    def decode_selected(self, sel, x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None,
                        t: int = 0) -> torch.Tensor:
        """Token t of x [T, D] through the fused decode kernels on the store's selection `sel` of
        its experts (float32 weights w [T, A]) → [D] (+ residual[t]). No host sync: a streamed
        step's graph captures it (graph_step)."""
        res = None if residual is None else residual[t].float().contiguous()
        return self._decode(sel, x[t], w[t], res, _attached_quant(x, sel.prepared.gate_up))

    def selected(self, sel, x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """forward's kernel path for one token x [1, D] on experts already selected (sel) with the router's
        float32 weights w [1, A]: [1, D], the shared experts added, residual too where given (takes_residual)."""
        out = self.decode_selected(sel, x, w, residual)[None]
        return out if self.shared is None else out + self.shared(x)

    def _decode(self, sel, x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None,
                qx=None) -> torch.Tensor:
        from sparkd.engine.kernels.matmul import GemvConfig
        from sparkd.engine.kernels.moe import moe_decode
        from sparkd.engine.kernels.moe_tiles import decode_tiles

        p = sel.prepared
        # the interpreter (CPU, tests) runs programs one by one: few, wide tiles (a step of one tile keeps it)
        tiles = {} if x.is_cuda else {"gate_up": None if p.gate_up.one_tile else GemvConfig(block_n=64),
                                      "down": None if p.down.one_tile else GemvConfig(block_n=64, split=2)}
        if "fold" not in DECODE_ON:  # the split down's ranges summed by a torch launch after it
            tiles = tiles | {"down": dataclasses.replace(tiles.get("down") or decode_tiles(p)[1], fold="torch")}
        if "quant_h" in DECODE_ON and p.gate_up.idot is not None and p.down.idot is not None:
            tiles = tiles | {"gate_up": dataclasses.replace(tiles.get("gate_up") or decode_tiles(p)[0],
                                                            fuse_quant=True)}
        # integer kernels (Family.idot) quantize x and h themselves, as round_x/round_h would
        return moe_decode(sel.prepared, x.float().contiguous(), w, self.kernel_act,
                          round_x=_rounder(sel.act_gate), round_h=_rounder(sel.act_down), residual=residual,
                          qx=qx, bias=sel.bias, **tiles)

    def routed(self, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor,
               shared_in: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(sum over each token's selected experts of weight * expert(x), shared experts on
        shared_in), in torch from the store's dequantized experts. x may be narrower than the
        router's input (a latent MoE routes on the full width and runs experts at a latent one);
        the shared experts keep the full width."""
        # T tokens, D expert input width, A experts per token, U distinct experts in the batch
        uniq = torch.unique(ids)  # [U]
        ew = self.store.get(self.il, uniq.tolist())  # a streaming store issues its misses' reads here
        # computed while those reads land
        shared = None if self.shared is None or shared_in is None else self.shared(shared_in)
        parts: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(uniq)
        # rounding is per token row, so round x once per layer, not once per expert
        xg = round_activations(x, ew.act_gate)
        xu = xg if ew.act_up == ew.act_gate else round_activations(x, ew.act_up)
        every = x.shape[0] == 1  # decode: every expert sees the one token
        for j in (range(len(uniq)) if ew.order is None else ew.order):
            tok, slot = (ids == uniq[j]).nonzero(as_tuple=True)
            hg, hu = (xg, xu) if every else (xg.index_select(0, tok), xu.index_select(0, tok))  # [t, D]
            # experts on the host while x is on a GPU (a store without kernels): bring them over
            g = hg @ ew.gate[j].to(x.device).T  # [t, F]
            u = hu @ ew.up[j].to(x.device).T
            if ew.gate_b is not None:
                g, u = g + ew.gate_b[j].to(x.device), u + ew.up_b[j].to(x.device)
            y = round_activations(self.act(g, u), ew.act_down) @ ew.down[j].to(x.device).T  # [t, D]
            if ew.down_b is not None:
                y = y + ew.down_b[j].to(x.device)
            parts[j] = (tok, y * w[tok, slot, None])
        out = torch.zeros_like(x)
        for tok, y in parts:  # id order, whatever the compute order was
            out.index_add_(0, tok, y)
        return out, shared


def _rounder(fmt: str | None):
    """The down input's rounding (llama.cpp rounds after the activation), or None."""
    return None if fmt is None else (lambda h: round_activations(h, fmt))


def _attached_quant(x: torch.Tensor, gate_up):
    """The int8 blocks of a one-token x that the norm before the layer wrote in the gate/up
    family's format (act_quant.attach; cuda_graphs.link_norm_quant), or None."""
    if x.shape[0] != 1 or gate_up.idot is None:
        return None
    from sparkd.engine.kernels import act_quant

    return act_quant.attached(x, gate_up.act_fmt)
