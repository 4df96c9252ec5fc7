"""A streamed model's trunk stays quantized (layers/qlinear.py) and the plan counts it so."""

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as T

from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.layers.act_round import round_activations, vec_dot_format
from sparkd.engine.layers.qlinear import QuantLinear, QuantRows, Scratch
from sparkd.engine.models import config_of
from sparkd.engine.quants import dequantize
from sparkd.engine.streaming.plan import EXPERT_WEIGHT, Budget, default_batch_tokens, make_plan, trunk_bytes

from tests.engine.test_quants import random_blocks


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("chunk_values", [64 * 512, 1 << 20], ids=["many-chunks", "one-chunk"])
def test_quant_linear_equals_linear_over_the_dequantized_weight(qtype, chunk_values):
    """Same bits as an f32 Linear (rows a multiple of 4, as in real models: see qlinear.py)."""
    rows, cols = 200, 512
    raw = torch.from_numpy(random_blocks(qtype, rows * cols // (32 if qtype == T.Q8_0 else 256), seed=2))
    w = dequantize(raw, qtype, (rows, cols))
    bias = torch.randn(rows)
    x = torch.randn(3, cols)
    ql = QuantLinear(QuantRows(raw, qtype, (rows, cols), Scratch(chunk_values)), bias, vec_dot_format(qtype))
    want = F.linear(round_activations(x, vec_dot_format(qtype)), w, bias)
    assert torch.equal(ql(x), want)
    assert ql.out_features == rows


def test_quant_rows_lookup_equals_the_dequantized_rows():
    raw = torch.from_numpy(random_blocks(T.Q8_0, 40 * 64 // 32, seed=4))
    table = QuantRows(raw, T.Q8_0, (40, 64), Scratch(128))
    ids = torch.tensor([3, 0, 39, 3])
    assert torch.equal(table[ids], dequantize(raw, T.Q8_0, (40, 64))[ids])


def test_trunk_term_is_the_quantized_file_size_plus_one_buffer(tiny_models):
    with GGUFModel.open(tiny_models["qwen3moe", "Q8_0"]) as g:
        trunk = {n: t for n, t in g.tensors.items() if not EXPERT_WEIGHT.match(n)}
        f32 = sum(t.n_elements * 4 for t in trunk.values())
        held = sum(t.n_elements * 36 // 32 if len(t.shape) == 2 and t.ggml_type == T.Q8_0 else t.n_elements * 4
                   for t in trunk.values())
        assert trunk_bytes(g) == held + (1 << 20) * 4
        assert held < f32 / 3  # int8 quants + f32 scale per 32: 3.6x smaller than f32


def test_prompt_chunk_shrinks_with_the_budget_and_an_explicit_one_wins(tiny_models):
    with GGUFModel.open(tiny_models["qwen3moe", "Q8_0"]) as g:
        cfg = config_of(g)
        big, small = (default_batch_tokens(cfg, 4096, b) for b in (1 << 40, 64 << 20))
        assert big == 512 and 16 <= small < big
        plan = make_plan(g, cfg, Budget(1 << 30, "t"), 4096, batch_tokens=7, runtime_bytes=0)
        assert plan.batch_tokens == 7
