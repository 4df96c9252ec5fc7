"""The generator: valid GGUFs for every arch and quant, deterministic, sizes, splits, bad inputs."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q, GGUFReader, LlamaFileType
from gguf.quants import dequantize

from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.make_model import file_type, layers_for_size, plan, write_model
from sparkd.engine.modelgen import blocks
from sparkd.engine.modelgen.specs import PRESETS, TINY


@pytest.mark.parametrize("qtype", blocks.QUANT_TYPES)
def test_random_blocks_have_the_requested_spread(qtype):
    rng = np.random.default_rng(0)
    data = np.concatenate(list(blocks.random_chunks(rng, qtype, 256 * 64, std=0.05)))
    values = dequantize(data, qtype)
    assert np.isfinite(values).all()
    assert 0.035 < values.std() < 0.065, (qtype.name, values.std())
    assert abs(values.mean()) < 0.02


def test_same_seed_same_bytes(tmp_path):
    p = plan(TINY["qwen3moe"], "Q8_0")
    a = write_model(tmp_path / "a.gguf", p, seed=7)[0].read_bytes()
    b = write_model(tmp_path / "b.gguf", p, seed=7)[0].read_bytes()
    c = write_model(tmp_path / "c.gguf", p, seed=8)[0].read_bytes()
    assert a == b and a != c


def test_rows_not_filling_blocks_fall_back_to_f16(tmp_path):
    path = write_model(tmp_path / "d.gguf", plan(TINY["deepseek2"], "Q8_0"))[0]
    with GGUFModel.open(path) as g:
        assert g.tensors["blk.0.attn_k_b.weight"].ggml_type == Q.F16  # rows of 16 < block of 32
        assert g.tensors["blk.0.attn_q_a.weight"].ggml_type == Q.Q8_0
        assert g.tensors["blk.0.attn_norm.weight"].ggml_type == Q.F32


def test_split_shards_open_as_one_model(tmp_path):
    p = plan(TINY["qwen3moe"], "F32")
    paths = write_model(tmp_path / "s.gguf", p, split_max_bytes=200_000)
    assert len(paths) > 1 and all(x.exists() for x in paths)
    with GGUFModel.open(paths[0]) as g:
        assert len(g.tensors) == len(p.tensors)


def test_size_scales_layer_count():
    s = PRESETS["qwen3-30b-a3b"]
    n = layers_for_size(s, "Q8_0", 2 << 30)
    assert plan(s.replace(n_layer=n), "Q8_0").nbytes <= 2 << 30 < plan(s.replace(n_layer=n + 1), "Q8_0").nbytes


@pytest.mark.parametrize("preset, billions", [("qwen3-30b-a3b", 30.5), ("qwen3-235b-a22b", 235.1),
                                              ("mixtral-8x7b", 46.7)])
def test_presets_have_their_models_parameter_counts(preset, billions):
    """A preset is a real model's shape: its F32 plan holds that model's published parameter count (within 0.5 %)."""
    params = plan(PRESETS[preset], "F32").nbytes / 4
    assert abs(params / 1e9 - billions) < 0.005 * billions, (preset, params)


@pytest.mark.parametrize("kw,msg", [
    (dict(n_expert_used=9), "--top-k 9 exceeds --experts 8"),
    (dict(n_layer=0), "--layers must be positive"),
    (dict(n_head=3), "--heads 3 is not a multiple"),
])
def test_bad_shapes_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        plan(TINY["qwen3moe"].replace(**kw), "F32")


def test_file_type_is_llama_cpps_ftype(tmp_path):
    """general.file_type holds a llama_ftype (llama.cpp's reading; Q8_0 is 7, not the GGML type's 8), one of its own
    for every type make-model writes."""
    path = write_model(tmp_path / "m.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=1)[0]
    field = GGUFReader(path).fields["general.file_type"]
    assert int(field.parts[field.data[0]][0]) == LlamaFileType.MOSTLY_Q8_0 == 7
    types = blocks.FLOAT_TYPES + blocks.QUANT_TYPES
    assert len({file_type(t) for t in types}) == len(types)
    assert file_type(Q.Q4_K) == LlamaFileType.MOSTLY_Q4_K_M and file_type(Q.MXFP4) == LlamaFileType.MOSTLY_MXFP4_MOE


def test_unknown_quant_is_refused():
    with pytest.raises(ValueError, match="could not make a model with --quant TQ1_0"):
        plan(TINY["qwen3moe"], "TQ1_0")
