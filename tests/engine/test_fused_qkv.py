"""q, k and v as one stack of their rows (KernelLinear.stack, Attention's wqkv): one x
quantization and one GEMV, the same bits as three projections, decode (GEMV) and prefill (GEMM);
and what cannot stack stays three.

Interpreter (TRITON_INTERPRET=1) where there is no GPU; the cuda variants carry the gpu marker.
"""

import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, random_blocks  # noqa: E402

from sparkd.engine.kernels import dispatch, matmul, prefill_gemm  # noqa: E402
from sparkd.engine.layers.act_round import vec_dot_format  # noqa: E402
from sparkd.engine.layers.attention import FUSE_QKV_ENV, Attention, fuse_qkv_default  # noqa: E402
from sparkd.engine.layers.kv_cache import KVCache  # noqa: E402
from sparkd.engine.layers.linear import PREFILL_PRECISION, KernelLinear, Linear  # noqa: E402
from sparkd.engine.layers.rope import RopeConfig  # noqa: E402

COLS = 8 * 256  # 8 groups: split-K on the interpreter's tile too


def kernel_linear(qtype: T, rows: int, backend: str, bias: bool = False) -> KernelLinear:
    raw = random_blocks(qtype, rows * COLS // dispatch.FAMILIES[qtype].block_values)
    b = torch.randn(rows, device=backend) if bias else None
    return KernelLinear(raw.to(backend), qtype, (rows, COLS), b, vec_dot_format(qtype))


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q5_K], ids=lambda t: t.name)  # integer and float GEMMs (Q5_K has no iblock)
@pytest.mark.parametrize("backend", BACKENDS)
def test_stack_gives_the_bits_of_its_parts(backend, qtype, monkeypatch):
    """Row counts that are no multiple of the tile, with biases; one token and three (the integer
    GEMM: one launch for the stack; the float one: a launch per part)."""
    parts = [kernel_linear(qtype, rows, backend, bias=True) for rows in (70, 9, 9)]
    qkv = KernelLinear.stack(parts)
    assert qkv.parts == (70, 9, 9) and qkv.shape == (88, COLS)
    gemm, shapes = prefill_gemm.gemm, []
    monkeypatch.setattr(prefill_gemm, "gemm", lambda w, qt, shape, *a, **k: shapes.append(shape) or gemm(w, qt, shape, *a, **k))
    for tokens in (1, 3):
        x = torch.randn(tokens, COLS, device=backend)
        want = torch.cat([m(x) for m in parts], dim=-1)
        shapes.clear()
        assert torch.equal(qkv(x), want), tokens
    one_launch = prefill_gemm.int_gemm(dispatch.FAMILIES[qtype], PREFILL_PRECISION)
    assert shapes == ([(88, COLS)] if one_launch else [(70, COLS), (9, COLS), (9, COLS)])
    assert one_launch == (qtype == T.Q8_0 and PREFILL_PRECISION == "int8")



@pytest.mark.parametrize("rule", matmul.SPLIT_RULES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_stack_across_the_split_threshold_keeps_each_parts_split(backend, rule, monkeypatch):
    """A part large enough to lose its split (old rule: split_for's TARGET_PROGRAMS row tiles; wave
    rule: more row tiles than a wave holds) while the others keep theirs: the stack runs each part
    with its own split, still the same bits."""
    monkeypatch.setattr(matmul, "SPLIT_RULE", rule)
    if rule == "old":
        monkeypatch.setattr(matmul, "TARGET_PROGRAMS", 2)  # 2 tiles of 64 rows (the interpreter's)
    cfg = matmul.default_config(dispatch.family(T.Q8_0)) if backend == "cuda" else matmul.GemvConfig(block_n=64)
    wave = 2 * -(-9 // cfg.block_n)  # the 9-row part keeps 2 ranges, the 130-row one has more tiles
    monkeypatch.setattr(matmul, "wave_programs", lambda num_warps, device=None: wave)
    parts = [kernel_linear(T.Q8_0, rows, backend) for rows in (130, 9)]
    assert (matmul.split_for(cfg, 130, 8, backend) != matmul.split_for(cfg, 9, 8, backend)) == (
        rule == "wave" or backend != "cuda")
    x = torch.randn(1, COLS, device=backend)
    assert torch.equal(KernelLinear.stack(parts)(x), torch.cat([m(x) for m in parts], dim=-1))


def test_what_cannot_share_one_launch_is_not_stacked():
    dev = "cuda" if ON_GPU else "cpu"
    q8, q6 = kernel_linear(T.Q8_0, 8, dev), kernel_linear(T.Q6_K, 8, dev)
    with_bias = kernel_linear(T.Q8_0, 8, dev, bias=True)
    dense = Linear(torch.randn(8, COLS))
    for layers in ([q8, q6, q8], [q8, with_bias, q8], [q8, dense, q8], [KernelLinear.stack([q8, q8]), q8, q8]):
        assert KernelLinear.stack(layers) is None


def attention(backend: str, fuse: bool, parts) -> Attention:
    q, k, v, o = parts
    return Attention(0, 4, 2, 16, RopeConfig(n_rot=16, base=10000.0, neox=True), q, k, v, o, fuse_qkv=fuse)


@pytest.mark.parametrize("v_type", [T.Q8_0, T.Q6_K], ids=["qkv", "qk+v"])  # Q4_K_M files: attn_v often Q6_K
@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_with_stacked_projections_gives_the_same_bits(backend, v_type, monkeypatch):
    """Prefill 3 tokens then decode 1, with and without the stack; the switch off keeps three."""
    parts = [kernel_linear(T.Q8_0, 64, backend), kernel_linear(T.Q8_0, 32, backend), kernel_linear(v_type, 32, backend)]
    parts.append(KernelLinear(random_blocks(T.Q8_0, COLS * 64 // 32).to(backend), T.Q8_0, (COLS, 64),
                              act_fmt="q8_0"))
    fused, apart = attention(backend, True, parts), attention(backend, False, parts)
    stacked = fused.wqkv if v_type == T.Q8_0 else fused.wqk
    assert stacked is not None and fused.wq is None and (fused.wv is None) == (v_type == T.Q8_0)
    assert apart.wqkv is None and apart.wqk is None
    outs = []
    for layer in (fused, apart):
        cache = KVCache(16, [(2, 16, 16)], device=backend)
        x = torch.randn(4, COLS, generator=torch.Generator().manual_seed(1)).to(backend)
        outs.append((layer(x[:3], torch.arange(3), cache), layer(x[3:], torch.tensor([3]), cache)))
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    monkeypatch.setenv(FUSE_QKV_ENV, "0")
    assert not fuse_qkv_default() and attention(backend, None, parts).wqkv is None
