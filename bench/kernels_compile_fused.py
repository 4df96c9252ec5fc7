"""The fused decode kernels compiled offline for sm_90, without a GPU: catches what only the
compiler rejects (loop-carried types, runtime loop bounds, constexpr branches) before a device
run, for the Triton installed (the box has 3.6: `pip install --target DIR triton==3.6.0` and put
DIR first on PYTHONPATH). Prints one line per variant; exits 1 on the first that fails.

Usage (not under TRITON_INTERPRET): PYTHONPATH=. python bench/kernels_compile_fused.py
"""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile

from sparkd.engine.kernels import (decode_attention, grouped_attention, pdl, rms_norm, rope_attention, rope_kv,
                                   router_topk)

INT64_POINTERS = ("pos_ptr", "ids_ptr")
FLOATS = ("eps", "scale", "min_sum")
ROPE_BASE = {"BLOCK_D": 128, "BLOCK_DV": 128}
GQA = {"SHARED": False, "BLOCK_DT": 16}  # grouped attention's keys and values apart
MLA = {"GROUP": 128, "HEAD_BLOCKS": 8, "HAS_SINKS": False, "BLOCK_H": 16, "BLOCK_S": 16, "BLOCK_DK": 512,
       "BLOCK_DV": 512, "N_R": 32, "SHARED": True, "BLOCK_DT": 64}  # 128 heads over the 512 + 64 latent keys
VARIANTS = [  # (kernel, constexprs, warps): the shapes the engine launches
    (rms_norm._rms_norm_rows, {"HAS_RES": False, "BLOCK": 2048, "QBLOCK": 0, "K8": False, "PARTS": 0}, 8),
    (rms_norm._rms_norm_rows, {"HAS_RES": True, "BLOCK": 128, "QBLOCK": 32, "K8": False, "PARTS": 0}, 4),
    (decode_attention._decode_attention,
     {"GROUP": 8, "HAS_SINKS": False, "BLOCK_S": 64, "BLOCK_DK": 128, "BLOCK_DV": 128, "RANGE": 0, "FOLD": 0}, 4),
    (decode_attention._decode_attention,  # "auto": 64-key ranges, the fold 32 ranges at a time
     {"GROUP": 8, "HAS_SINKS": True, "BLOCK_S": 32, "BLOCK_DK": 64, "BLOCK_DV": 64, "RANGE": 64, "FOLD": 32}, 4),
    (decode_attention._decode_attention,  # MLA: 576-wide keys, 512-wide values
     {"GROUP": 1, "HAS_SINKS": False, "BLOCK_S": 16, "BLOCK_DK": 1024, "BLOCK_DV": 512, "RANGE": 64, "FOLD": 32}, 4),
    (rope_kv._rope_kv, {"NEOX": True, "NORM": True, "HAS_V": True, **ROPE_BASE}, 1),
    (rope_kv._rope_kv, {"NEOX": False, "NORM": False, "HAS_V": False, **ROPE_BASE}, 1),
    (rope_attention._rope_attention, {"GROUP": 8, "NEOX": True, "NORM": True, "HAS_SINKS": False, "KEYS": 32,
                                      "BLOCK_DK": 128, "BLOCK_DV": 128, "FOLD": 32}, 4),
    (rope_attention._rope_attention, {"GROUP": 8, "NEOX": False, "NORM": False, "HAS_SINKS": True, "KEYS": 64,
                                      "BLOCK_DK": 64, "BLOCK_DV": 64, "FOLD": 32}, 4),
    (grouped_attention._grouped_attention,  # "grouped" (session 29): Qwen3's 8 query heads a KV head, a sink
     {"GROUP": 8, "HEAD_BLOCKS": 1, "HAS_SINKS": True, "BLOCK_H": 16, "BLOCK_S": 64, "BLOCK_DK": 128, "BLOCK_DV": 128,
      "N_R": 32, "HALF": False, **GQA}, 4),
    (grouped_attention._grouped_attention,  # 20 query heads a KV head at 64 wide: two head blocks
     {"GROUP": 20, "HEAD_BLOCKS": 2, "HAS_SINKS": False, "BLOCK_H": 16, "BLOCK_S": 64, "BLOCK_DK": 64, "BLOCK_DV": 64,
      "N_R": 32, "HALF": False, **GQA}, 4),
    (grouped_attention._grouped_attention_fold,
     {"GROUP": 8, "HEAD_BLOCKS": 1, "BLOCK_H": 16, "BLOCK_S": 64, "BLOCK_DV": 128, "N_R": 32, "FOLD_DV": 128}, 4),
    (grouped_attention._grouped_attention_fold,  # MLA with one head block: 128 ranges of 512 values
     {"GROUP": 16, "HEAD_BLOCKS": 1, "BLOCK_H": 16, "BLOCK_S": 16, "BLOCK_DV": 512, "N_R": 128, "FOLD_DV": 32}, 4),
    *[(router_topk._router_topk, {"GATING": g, "HAS_BIAS": g == 1, "NORM": True, "SCALE": g == 1,
                                  "TOP_K": 8, "BLOCK_E": 128, "BLOCK_K": 8}, 1) for g in range(4)],
]
HALF_KV = [  # (kernel, constexprs, warps, the cache pointers as float16): --kv-type f16 (session 30)
    (decode_attention._decode_attention,
     {"GROUP": 8, "HAS_SINKS": True, "BLOCK_S": 32, "BLOCK_DK": 128, "BLOCK_DV": 128, "RANGE": 64, "FOLD": 32}, 4,
     ("k_ptr", "v_ptr")),
    (rope_kv._rope_kv, {"NEOX": True, "NORM": True, "HAS_V": True, **ROPE_BASE}, 1, ("k_cache_ptr", "v_cache_ptr")),
    (rope_attention._rope_attention, {"GROUP": 8, "NEOX": True, "NORM": True, "HAS_SINKS": False, "KEYS": 32,
                                      "BLOCK_DK": 128, "BLOCK_DV": 128, "FOLD": 32}, 4, ("k_cache_ptr", "v_cache_ptr")),
    (grouped_attention._grouped_attention,
     {"GROUP": 8, "HEAD_BLOCKS": 1, "HAS_SINKS": True, "BLOCK_H": 16, "BLOCK_S": 64, "BLOCK_DK": 128, "BLOCK_DV": 128,
      "N_R": 32, "HALF": True, **GQA}, 4, ("k_ptr", "v_ptr")),
    (grouped_attention._grouped_attention, {**MLA, "HALF": True}, 4, ("k_ptr", "v_ptr")),  # session 31
]


def arg_type(name: str, half: tuple[str, ...] = ()) -> str:
    """The launch's argument type by name: float32 (float16: the names in half) or int64 pointers, float scalars,
    else int32."""
    if name.endswith("_ptr"):
        return "*i64" if name in INT64_POINTERS else "*fp16" if name in half else "*fp32"
    return "fp32" if name in FLOATS else "i32"


def aligned(name: str) -> bool:
    """Whether a launch sees this argument as divisible by 16, as Triton specialises it at the engine's shapes: the
    tensors (but the one-position pos_ptr) and the strides and widths. Without it every load compiles scalar and the
    loops' software pipeline (cp.async) is not what the box runs (session 30)."""
    return (name.endswith("_ptr") and name not in INT64_POINTERS) or "stride" in name or name in ("DK", "DV")


def build(kern, consts: dict, warps: int, half: tuple[str, ...] = ()) -> int:
    """Compile one variant for sm_90; the PTX's length."""
    consts = pdl.compile_args(kern, consts)
    sig = {name: "constexpr" if name in consts else arg_type(name, half) for name in kern.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kern.arg_names)
             if name not in consts and aligned(name)}
    src = ASTSource(fn=kern, signature=sig, constexprs={(kern.arg_names.index(k),): v for k, v in consts.items()},
                    attrs=attrs)
    return len(compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"])


def main() -> int:
    print(f"triton {triton.__version__}, target sm_90")
    for kern, consts, warps, *half in VARIANTS + HALF_KV:
        what = f"{kern.__name__} {consts}" + (f" float16 {', '.join(half[0])}" if half else "")
        try:
            size = build(kern, consts, warps, *half)
        except Exception as exc:  # noqa: BLE001 - name the variant, then stop
            print(f"FAILED {what}: {exc}")
            return 1
        print(f"ok {what}: {size} bytes of PTX")
    return 0


if __name__ == "__main__":
    sys.exit(main())
