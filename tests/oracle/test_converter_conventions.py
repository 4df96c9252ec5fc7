"""Real converter conventions: transformers → llama.cpp's convert_hf_to_gguf.py → our engine.

The matrix models come from our own GGUF writer; these come from transformers through the
official converter (the llama.cpp vendored in llama-cpp-python 0.3.36, with its own gguf-py),
so tensor layouts, MLA splitting, rope ordering, gating metadata and norm placement are the
converter's, not ours. The reference is transformers' own forward pass in float64.

Measured 2026-11-30 (24 tokens, F32 GGUF), max |ours - hf64| / max |hf64|:
qwen3moe 5.1e-7, deepseek-v3 5.7e-7 (transformers float32 itself: 5.8e-7 / 5.6e-7).
Numbers and the softmax-gating trap are in docs/engine-numerics.md.
"""

from __future__ import annotations

import numpy as np
import pytest
from compare import agreement, full_logits
from hf_tiny import TINY, build_hf_model, convert, hf_logits
from llama_oracle import llama_source_dir

from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.models import load_model
from sparkd.engine.models.config import GATING_SOFTMAX

pytestmark = pytest.mark.oracle

F32_REL_ERR = 1e-4
TOKENS = np.random.default_rng(7).integers(0, 256, 24).tolist()  # byte tokens; no text needed
GATING_KEY = "deepseek2.expert_gating_func"
GATING_SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
# The softmax-gated GGUF of a sigmoid-routed model must be clearly wrong, not float noise
# (measured 2026-11-30: relative error 0.78, top-1 0.58).
TRAP_MIN_REL_ERR = 1e-2


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """arch → (transformers dir, F32 GGUF); plus "deepseek-v3-no-hub-keys", saved the way
    transformers 5.x saves it (no scoring_func), to show that the trap is real."""
    pytest.importorskip("transformers", reason="the converter oracle needs transformers "
                        "(pip install transformers tokenizers safetensors)")
    root = tmp_path_factory.mktemp("hf-tiny")
    dirs = {arch: build_hf_model(arch, root) for arch in TINY}
    dirs["deepseek-v3-no-hub-keys"] = build_hf_model("deepseek-v3", root, hub_keys=False)
    jobs = {name: (d, root / f"{name}.f32.gguf") for name, d in dirs.items()}
    convert(list(jobs.values()), llama_source_dir())
    return jobs


def _ours(gguf_path) -> np.ndarray:
    m = load_model(gguf_path)
    try:
        return full_logits(m.net, TOKENS)
    finally:
        m.close()


@pytest.mark.parametrize("arch", sorted(TINY))
def test_f32_logits_match_transformers(converted, arch):
    model_dir, gguf_path = converted[arch]
    ref = hf_logits(model_dir, TOKENS, "float64")
    a = agreement(ref, _ours(gguf_path))
    print(f"{arch} F32 vs transformers float64: {a}; "
          f"transformers float32: {agreement(ref, hf_logits(model_dir, TOKENS, 'float32'))}")
    assert a.rel_err <= F32_REL_ERR, a
    assert a.top1 == 1.0, a


def test_deepseek_v3_without_scoring_func_gets_softmax_gating(converted):
    """transformers 5.x drops scoring_func; the converter then omits the gating key, a reader
    falls back to softmax (DeepSeek-V2's gating, as llama.cpp does) and the GGUF computes a
    different model. With the hub keys restored the converter writes sigmoid."""
    with GGUFModel.open(converted["deepseek-v3"][1]) as g:
        assert g.metadata[GATING_KEY] == GATING_SIGMOID
    model_dir, gguf_path = converted["deepseek-v3-no-hub-keys"]
    with GGUFModel.open(gguf_path) as g:
        assert GATING_KEY not in g.metadata
    m = load_model(gguf_path)
    try:
        assert m.cfg.gating == GATING_SOFTMAX
        a = agreement(hf_logits(model_dir, TOKENS, "float64"), full_logits(m.net, TOKENS))
    finally:
        m.close()
    print(f"deepseek-v3 without scoring_func: {a}")
    assert a.rel_err > TRAP_MIN_REL_ERR, a
