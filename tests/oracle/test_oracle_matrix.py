"""The oracle matrix: every architecture x dtype, our logits against llama.cpp's on the same
generated GGUF (48 tokens), llama.cpp's greedy decode against ours, incremental vs full recompute.

Each model is generated once per session (K-quant shapes have rows of 256, see matrix_shape)
and every check reads it. Measured values and thresholds: THRESHOLDS below and
docs/engine-numerics.md (regenerate with `python tests/oracle/numerics_table.py`).
"""

from __future__ import annotations

import numpy as np
import pytest

from compare import agreement, first_divergence, full_logits, greedy, incremental_logits, near_tie
from llama_oracle import llama_generate, llama_logits
from matrix_models import ARCHS, DTYPES, TOKENS, matrix_model
from sparkd.engine.models import load_model

pytestmark = pytest.mark.oracle

N_GREEDY = 32
F32_REL_ERR = 1e-4
# Quantized (and F16) models: (min top-1, max mean KL). Measured worst cases 2026-11-30 are in
# docs/engine-numerics.md; the bars leave ~3x room on KL and allow one flipped position in 48.
QUANT_TOP1, QUANT_KL = 0.93, 5e-3
# Greedy: F32 must be identical; elsewhere a divergence must be a near-tie in llama.cpp's logits or in ours.
EXACT_GREEDY = ("F32",)
# measured divergence margins 0.0027-0.0164 logits (5 of 30 models, llama.cpp's); on an AVX-512 machine
# deepseek2 Q6_K diverges at token 7 with llama.cpp's margin 0.125 but ours 0.010 (docs/engine-numerics.md)
NEAR_TIE_LOGITS = 0.05
# Incremental vs full: F32 is float noise; quantized activations amplify it (a value on a Q8_K
# rounding boundary moves one quantum), so the quantized bar is the measured worst case x3.
# Measured 2026-11-30: F32 <= 2.9e-6; Q4_K 4.9e-7 (llama) .. 0.122 (gpt-oss, one routing flip).
INCREMENTAL_REL_ERR = {"F32": 1e-5, "Q4_K": 0.3}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("oracle-matrix")


@pytest.fixture(scope="session")
def loaded(model_dir):
    cache: dict = {}

    def get(arch: str, dtype: str):
        if (arch, dtype) not in cache:
            path = matrix_model(model_dir, arch, dtype)
            cache[arch, dtype] = (path, load_model(path))
        return cache[arch, dtype]
    yield get
    for _, m in cache.values():
        m.close()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_llama_cpp(loaded, arch, dtype):
    path, m = loaded(arch, dtype)
    a = agreement(llama_logits(path, TOKENS), full_logits(m.net, TOKENS))
    print(f"{arch} {dtype}: {a}")
    if dtype == "F32":
        assert a.rel_err <= F32_REL_ERR, a
    else:
        assert a.top1 >= QUANT_TOP1 and a.kl <= QUANT_KL, a


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_decode_identical(loaded, arch, dtype):
    path, m = loaded(arch, dtype)
    prompt = TOKENS[:8]
    ours = greedy(m.net, prompt, N_GREEDY)
    theirs = llama_generate(path, prompt, N_GREEDY, stop_at_eog=False)
    div = first_divergence(path, prompt, ours, theirs, llama_logits, m.net)
    if div is not None:
        print(f"{arch} {dtype}: greedy diverges at {div[0]}, llama.cpp margin {div[1]:.4f}, ours {div[2]:.4f}")
    assert div is None or (dtype not in EXACT_GREEDY and near_tie(div, NEAR_TIE_LOGITS)), div


@pytest.mark.parametrize("dtype", ["F32", "Q4_K"])
@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_equals_full_recompute(loaded, arch, dtype):
    _, m = loaded(arch, dtype)
    full = full_logits(m.net, TOKENS)
    inc = incremental_logits(m.net, TOKENS, n_prompt=5)
    err = np.abs(full - inc).max() / np.abs(full).max()
    print(f"{arch} {dtype}: incremental vs full {err:.2e}, top-1 {(full.argmax(-1) == inc.argmax(-1)).mean():.3f}")
    assert err <= INCREMENTAL_REL_ERR[dtype], f"{arch} {dtype}: {err:.2e}"
