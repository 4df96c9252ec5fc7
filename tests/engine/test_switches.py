"""Every SPARKD_* environment switch of the engine (sparkd/engine/switches.py, docs/engine.md's
table): a value it does not take stops with an error naming the variable, the value and the values
it takes; the values it takes (and unset) give the documented behaviour. Switches read at import
are tried in one subprocess that sets each value and reloads the module reading it; those read per
call run here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from sparkd.engine import switches  # noqa: E402
from sparkd.engine.cuda_graphs import decode_pipeline_default, device_argmax_default, load_draw_graphs_default  # noqa: E402
from sparkd.engine.prompt_graphs import continue_graphs_default, continue_rule_default, prefill_graphs_default  # noqa: E402
from sparkd.engine.layers.attention import fuse_qkv_default  # noqa: E402
from sparkd.engine.device_sampler import device_sampling_default  # noqa: E402
from sparkd.engine.layers.quant_experts import down_layout as moe_down_layout  # noqa: E402
from sparkd.engine.layers.quant_experts import gate_up_layout as moe_gate_up_layout  # noqa: E402
from sparkd.engine.layers.quant_experts import mxfp4_layout as moe_mxfp4_layout  # noqa: E402
from sparkd.engine.layers.quant_experts import q4_0_layout as moe_q4_0_layout  # noqa: E402
from sparkd.engine.models.decoder import prompt_last_only  # noqa: E402
from sparkd.engine.server.app import load_stream_default  # noqa: E402
from sparkd.engine.models.weights import (resident_q4_0_layout, resident_q4_k_layout, resident_q6_k_layout,  # noqa: E402
                                          resident_q8_0_layout)
from sparkd.engine.streaming.graph_step import graphs_mode as stream_graphs_mode  # noqa: E402
from sparkd.engine.streaming.zero_copy import table_mode  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
UNSET = None
FLAG = {"1": True, "on": True, " ON ": True, "0": False, "off": False, UNSET: True}
# SPARKD_IQ4_XS_INT / SPARKD_Q4_0_INT (and the grid i-quants', session 23) switch the integer GEMV step and (session 22)
# the prefill GEMM's iblock together
INT_STEP_AND_GEMM = "[m.FAMILY.idot is not None, m.FAMILY.iblock is not None]"
INT_FLAGS = {k: [v, v] for k, v in FLAG.items()}


@dataclass(frozen=True)
class Switch:
    name: str
    module: str | None  # read at import by this module (value = eval(read) with m the module), else per call
    read: str | Callable  # at import: an expression of m; per call: a function reading it
    bad: str
    good: dict = field(default_factory=dict)  # value (UNSET: not set) -> what expr gives
    takes: tuple[str, ...] = ()  # the accepted values the error lists


SWITCHES = [
    Switch("SPARKD_FUSED_KERNELS", "sparkd.engine.kernels.fused", "m.current()", "norm",
           {UNSET: "rms_norm,rope_kv,attention,router,norm_quant,norm_fold,rope_attention,hyper_conn,rope_tail,compressor",
            "none": "none",
            "": "none",
            "router, rms_norm": "rms_norm,router", "rms_norm,rope_kv,attention,router,norm_quant":
            "rms_norm,rope_kv,attention,router,norm_quant"}, ("all", "none", "rms_norm", "norm_quant", "norm_fold",
                                                             "rope_attention", "hyper_conn", "rope_tail", "compressor")),
    Switch("SPARKD_FUSED_EAGER", "sparkd.engine.kernels.fused", "[m.one_token(False), m.one_token(True)]",
           "no", {k: [v, True] for k, v in FLAG.items()}, switches.ON + switches.OFF),
    Switch("SPARKD_GEMV_FOLD", "sparkd.engine.kernels.matmul", "m.GemvConfig().fold", "atomics",
           {UNSET: "kernel", "kernel": "kernel", "torch": "torch"}, ("kernel", "torch")),
    Switch("SPARKD_Q6_K_INT", "sparkd.engine.kernels.q6_k", "m.FAMILY.idot is not None", "false", FLAG,
           switches.ON + switches.OFF),
    # the integer steps with an integer prefill GEMM: IQ4_XS and Q4_0 (sessions 21-22), the grid i-quants (session 22,
    # iq50; on by default since session 23, timed on the H200)
    *(Switch(f"SPARKD_{t}_INT", f"sparkd.engine.kernels.{t.lower()}", INT_STEP_AND_GEMM, "false", INT_FLAGS,
             switches.ON + switches.OFF) for t in ("IQ4_XS", "Q4_0", "IQ2_XXS", "IQ3_XXS", "IQ2_XS", "IQ1_S",
                                                                   "IQ1_M", "IQ2_S", "IQ3_S", "MXFP4")),
    Switch("SPARKD_Q4_K_TILED_LOADS", "sparkd.engine.kernels.q4_k_tiled",
           "[k for k, f in m.FAMILIES.items() if f is m.FAMILY]", "wide",
           {UNSET: ["pairx"], "scalar": ["scalar"], "vector": ["vector"], "bytes": ["bytes"], "pairx": ["pairx"]},
           ("scalar", "vector", "bytes", "pairx")),
    Switch("SPARKD_MOE_DECODE", "sparkd.engine.layers.moe", "sorted(m.DECODE_ON)", "ids,gather",
           {UNSET: ["fold", "ids", "quant_h", "residual", "router"], "none": [], "ids,fold": ["fold", "ids"]},
           ("all", "none", "ids", "fold", "residual", "quant_h", "router")),
    Switch("SPARKD_MOE_TILES", "sparkd.engine.kernels.moe_tiles", "m.TILES", "olde",
           {UNSET: "new", "new": "new", "s14": "s14", "s8": "s8", "s7": "s7", "s6r2": "s6r2", "s6": "s6", "s5": "s5",
            "old": "old"},
           ("old", "s5", "s6", "s6r2", "s7", "s8", "s14", "new")),
    Switch("SPARKD_MOE_DOWN_LAUNCH", "sparkd.engine.kernels.moe_tiles", "m.DOWN_LAUNCH", "late",
           {UNSET: "auto", "auto": "auto", "start": "start", "loop": "loop"}, ("auto", "start", "loop")),
    Switch("SPARKD_MOE_PIPE", "sparkd.engine.kernels.moe_tiles", "m.PIPE", "on",
           {UNSET: "auto", "auto": "auto", "off": "off"}, ("auto", "off")),
    Switch("SPARKD_TOP_P_BINS", "sparkd.engine.kernels.top_p_select", "m.BINS", "1000",
           {UNSET: 1024, "2048": 2048, " 4096 ": 4096, "512": 512}, ("512", "1024", "2048", "4096")),
    Switch("SPARKD_MOE_DOWN_AHEAD", "sparkd.engine.kernels.moe_tiles", "m.DOWN_AHEAD", "on",
           {UNSET: "auto", "auto": "auto", "off": "off"}, ("auto", "off")),
    Switch("SPARKD_MOE_PAIRX_STEPS", "sparkd.engine.kernels.moe_tiles", "m.PAIRX_STEPS", "on",
           {UNSET: "auto", "auto": "auto", "off": "off"}, ("auto", "off")),
    Switch("SPARKD_MOE_PAIR_FOLD", "sparkd.engine.kernels.moe_tiles", "m.PAIR_FOLD", "on",
           {UNSET: "auto", "auto": "auto", "off": "off"}, ("auto", "off")),
    Switch("SPARKD_MOE_PAIRX_DOWN", "sparkd.engine.kernels.moe_tiles", "m.PAIRX_DOWN", "on",
           {UNSET: "auto", "auto": "auto", "off": "off"}, ("auto", "off")),
    Switch("SPARKD_MOE_DOWN_EARLY", "sparkd.engine.kernels.moe_tiles", "m.DOWN_EARLY", "on",
           {UNSET: "auto", "auto": "auto", "off": "off"}, ("auto", "off")),
    Switch("SPARKD_GEMV_SPLIT", "sparkd.engine.kernels.matmul", "m.SPLIT_RULE", "fast",
           {UNSET: "wave", "wave": "wave", "Old": "old"}, ("wave", "old")),
    Switch("SPARKD_GEMV_WHOLE_UNROLL", "sparkd.engine.kernels.matmul", "m.GEMV_TILES['Q4_K_TILED'].whole_unroll",
           "two", {k: 2 if v else 0 for k, v in FLAG.items()}, switches.ON + switches.OFF),
    Switch("SPARKD_GEMV_WARPS_K", "sparkd.engine.kernels.matmul", "m.GEMV_TILES['Q4_K_TILED'].warps_k",
           "yes", FLAG, switches.ON + switches.OFF),
    Switch("SPARKD_PDL", "sparkd.engine.kernels.pdl", "m.current()", "maybe",
           {UNSET: "auto", "auto": "auto", " On ": "on", "off": "off"}, ("auto", "on", "off")),
    Switch("SPARKD_DECODE_ATTENTION_SPLIT", "sparkd.engine.kernels.decode_attention", "m.SPLIT_RULE", "half",
           {UNSET: "grouped", "grouped": "grouped", "auto": "auto", "serial": "serial", " Off ": "off"},
           ("grouped", "auto", "serial", "off")),
    Switch("SPARKD_KDA_PROMPT", "sparkd.engine.layers.kda", "m.PROMPT_RULE", "chunked",
           {UNSET: "auto", " Chunks ": "chunks", "loop": "loop", "auto": "auto"}, ("auto", "loop", "chunks")),
    Switch("SPARKD_PDL_PREFETCH", "sparkd.engine.kernels.pdl", "m.current_prefetch()", "l3",
           {UNSET: "small", "off": "off", " Lines ": "lines", "bulk": "bulk", "small": "small"},
           ("off", "lines", "bulk", "small")),
    Switch("SPARKD_EAGER_STEP", "sparkd.engine.streaming.eager_step", "sorted(p for p in m.PARTS if m.on(p))",
           "graphs", {UNSET: ["device_pick", "norm_quant"], "none": [], "device_pick": ["device_pick"]},
           ("all", "none", "norm_quant", "device_pick")),
    Switch("SPARKD_DEVICE_SAMPLING", None, device_sampling_default, "yes",
           {"1": "fused", "on": "fused", " ON ": "fused", "0": "off", "off": "off", UNSET: "fused",
            "torch": "torch", "Fused": "fused", "capped": "capped", "chain-top-p": "chain-top-p"},
           ("1", "on", "0", "fused", "chain-top-p", "capped", "torch", "off")),
    Switch("SPARKD_FUSED_QKV", None, fuse_qkv_default, "yes", FLAG, switches.ON + switches.OFF),
    Switch("SPARKD_DEVICE_ARGMAX", None, device_argmax_default, "2", FLAG, switches.ON + switches.OFF),
    Switch("SPARKD_DECODE_PIPELINE", None, decode_pipeline_default, "on",
           {UNSET: True, "auto": True, " OFF ": False}, ("auto", "off")),
    Switch("SPARKD_LOAD_DRAW_GRAPHS", None, load_draw_graphs_default, "lazy", FLAG, switches.ON + switches.OFF),
    Switch("SPARKD_LOAD_STREAM", None, load_stream_default, "later", FLAG, switches.ON + switches.OFF),
    Switch("SPARKD_PREFILL_GRAPHS", None, prefill_graphs_default, "graphs", FLAG, switches.ON + switches.OFF),
    Switch("SPARKD_CONTINUE_GRAPHS", None, continue_graphs_default, "graphs", FLAG, switches.ON + switches.OFF),
    Switch("SPARKD_CONTINUE_RULE", None, continue_rule_default, "never",
           {UNSET: "share", "share": "share", "always": "always"}, ("share", "always")),
    Switch("SPARKD_Q8_0_LAYOUT", None, resident_q8_0_layout, "tiled",
           {UNSET: "packed", "packed": "packed", "GGUF": "gguf"}, ("packed", "gguf")),
    Switch("SPARKD_Q4_K_LAYOUT", None, resident_q4_k_layout, "packed",
           {UNSET: "tiled", "tiled": "tiled", "gguf": "gguf"}, ("tiled", "gguf")),
    Switch("SPARKD_Q6_K_LAYOUT", None, resident_q6_k_layout, "packed",
           {UNSET: "tiled", "tiled": "tiled", "gguf": "gguf"}, ("tiled", "gguf")),
    Switch("SPARKD_Q4_0_LAYOUT", None, resident_q4_0_layout, "packed",
           {UNSET: "tiled", "tiled": "tiled", "GGUF": "gguf"}, ("tiled", "gguf")),
    Switch("SPARKD_MOE_GATE_UP_LAYOUT", None, moe_gate_up_layout, "pairx",
           {UNSET: "tiled", "tiled": "tiled", "GGUF": "gguf"}, ("tiled", "gguf")),
    Switch("SPARKD_MOE_MXFP4_LAYOUT", None, moe_mxfp4_layout, "packed",
           {UNSET: "tiled", "tiled": "tiled", "GGUF": "gguf"}, ("tiled", "gguf")),
    Switch("SPARKD_MOE_Q4_0_LAYOUT", None, moe_q4_0_layout, "pairx",
           {UNSET: "tiled", "tiled": "tiled", "GGUF": "gguf"}, ("tiled", "gguf")),
    Switch("SPARKD_MOE_DOWN_LAYOUT", None, moe_down_layout, "pairx",
           {UNSET: "auto", "auto": "auto", "tiled": "tiled", "GGUF": "gguf", " All": "all"},
           ("auto", "tiled", "gguf", "all")),
    Switch("SPARKD_STREAM_GRAPHS", None, stream_graphs_mode, "on",
           {UNSET: "experts", "experts": "experts", "Segments": "segments", "off": "off"},
           ("experts", "segments", "off")),
    Switch("SPARKD_STREAM_TABLE", None, table_mode, "fast",
           {UNSET: "cached", "cached": "cached", "checked": "checked"}, ("cached", "checked")),
    Switch("SPARKD_MOE_PREFILL", "sparkd.engine.kernels.moe_prefill", "m.PREFILL", "fast",
           {UNSET: "grouped", "grouped": "grouped", "Loop": "loop"}, ("grouped", "loop")),
    Switch("SPARKD_MOE_PREFILL_TILE", "sparkd.engine.kernels.moe_prefill", "m.PREFILL_TILE", "48",
           {UNSET: "auto", "16": "16", "32": "32", " 64 ": "64"}, ("auto", "16", "32", "64")),
    Switch("SPARKD_IGEMM", "sparkd.engine.kernels.prefill_gemm", "m.IGEMM_WAY", "s9",
           {UNSET: "s13", "s13": "s13", "s12": "s12", " S11 ": "s11"}, ("s13", "s12", "s11")),
    Switch("SPARKD_MOE_PREFILL_GLUE", "sparkd.engine.kernels.moe_prefill", "m.PREFILL_GLUE", "fused",
           {UNSET: "kernels", "kernels": "kernels", "Torch": "torch"}, ("kernels", "torch")),
    Switch("SPARKD_MOE_SLOT_CHECK", "sparkd.engine.layers.moe", "m.SLOT_CHECK", "never",
           {UNSET: "router", "router": "router", "Always": "always"}, ("router", "always")),
    Switch("SPARKD_PREFILL_STACK", "sparkd.engine.layers.linear", "m.PREFILL_STACK", "fused",
           {UNSET: "one", "one": "one", "Parts": "parts"}, ("one", "parts")),
    Switch("SPARKD_PREFILL_PRECISION", "sparkd.engine.layers.linear", "m.PREFILL_PRECISION", "fp16",
           {UNSET: "int8", "ieee": "ieee", "tf32x3": "tf32x3", " TF32 ": "tf32", "Int8": "int8"},
           ("ieee", "tf32x3", "tf32", "int8")),
    Switch("SPARKD_PREFILL_FLOAT_GEMM", "sparkd.engine.layers.linear", "m.PREFILL_FLOAT_GEMM", "cublas",
           {UNSET: "torch", "kernel": "kernel", "Torch": "torch"}, ("kernel", "torch")),
    Switch("SPARKD_HALF_PROMPT", "sparkd.engine.layers.linear", "m.HALF_PROMPT", "cublas",
           {UNSET: "half", "kernel": "kernel", "Torch": "torch", "half": "half"}, ("torch", "half", "kernel")),
    Switch("SPARKD_SLAB_GEMM", "sparkd.engine.layers.linear", "m.SLAB_GEMM", "fp16",
           {UNSET: "bf16", " BF16 ": "bf16", "f16": "f16", "Off": "off"}, ("bf16", "f16", "off")),
    Switch("SPARKD_PREFILL_ATTENTION", "sparkd.engine.layers.attention", "m.PREFILL_ATTENTION", "flash",
           {UNSET: "sdpa", "sdpa": "sdpa", "Kernel": "kernel", " TORCH ": "torch"}, ("sdpa", "kernel", "torch")),
    Switch("SPARKD_CONTINUE_ATTENTION", "sparkd.engine.layers.attention", "m.CONTINUE_ATTENTION", "attend",
           {UNSET: "sdpa", " SDPA ": "sdpa", "sdpa-mask": "sdpa-mask", "torch": "torch"}, ("sdpa", "sdpa-mask", "torch")),
    Switch("SPARKD_SDPA_PRECISION", "sparkd.engine.layers.attention", "m.SDPA_PRECISION", "bf16",
           {UNSET: "half", " Half ": "half", "float32": "float32"}, ("float32", "half")),
    Switch("SPARKD_MLA_PROMPT", "sparkd.engine.layers.mla", "m.MLA_PROMPT", "flash",
           {UNSET: "mha", " MHA ": "mha", "absorbed": "absorbed"}, ("mha", "absorbed")),
    Switch("SPARKD_PROMPT_LOGITS", None, prompt_last_only, "first",
           {UNSET: True, "last": True, "ALL": False}, ("last", "all")),
]

# one process: per switch read at import, set each value, reload the module, record what it gives
_PROBE = """
import importlib, json, os, sys
out = {}
for name, module, expr, values in json.loads(sys.argv[1]):
    m = importlib.import_module(module)
    for value in values:
        os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        try:
            importlib.reload(m)
            out[f"{name}={value}"] = {"value": eval(expr)}
        except Exception as e:
            out[f"{name}={value}"] = {"error": f"{type(e).__name__}: {e}"}
    os.environ.pop(name, None)
    importlib.reload(m)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def read_at_import() -> dict:
    probes = [(s.name, s.module, s.read, [*s.good, s.bad]) for s in SWITCHES if s.module]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *sys.path])
    run = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(probes)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _per_call(s: Switch, value: str | None, monkeypatch) -> dict:
    if value is None:
        monkeypatch.delenv(s.name, raising=False)
    else:
        monkeypatch.setenv(s.name, value)
    try:
        return {"value": s.read()}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


@pytest.mark.parametrize("s", SWITCHES, ids=lambda s: s.name)
def test_switch_takes_its_values_and_refuses_others(s, read_at_import, monkeypatch):
    got = {v: read_at_import[f"{s.name}={v}"] if s.module else _per_call(s, v, monkeypatch)
           for v in [*s.good, s.bad]}
    for value, want in s.good.items():
        assert got[value] == {"value": want}, f"{s.name}={value!r}"
    error = got[s.bad].get("error", "")
    assert error.startswith("SwitchError: could not "), got[s.bad]
    assert s.name in error and s.bad in error and all(t in error for t in s.takes), error


def test_every_switch_is_tested_and_documented():
    """The SPARKD_* names the engine reads are those above and those of docs/engine.md's table."""
    source = {n for p in (REPO / "sparkd/engine").rglob("*.py")
              for n in re.findall(r'"(SPARKD_[A-Z0-9_]+)"', p.read_text())}
    documented = set(re.findall(r"^\| `(SPARKD_[A-Z0-9_]+)`", (REPO / "docs/engine.md").read_text(), re.M))
    assert source == {s.name for s in SWITCHES} == documented
