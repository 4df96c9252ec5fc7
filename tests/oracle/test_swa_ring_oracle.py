"""gpt-oss's and Gemma 3's sliding-window layers keep rings of window + RING_SLACK rows (layers/kv_cache.py): over
1100 positions, past the tiny models' rings (window 4 or 8, + 1024 rows), our logits, a prompt in chunks and then one
token a step (each ring wrapped, its rows overwritten), against llama.cpp's over the whole sequence at once (its
cache holds every position). Threshold: test_oracle_logits' F32 bound (relative error <= 1e-4)."""

import dataclasses

import numpy as np
import pytest
import torch

from compare import agreement
from llama_oracle import llama_logits
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model

pytestmark = pytest.mark.oracle

TOKENS = [(i * 37 + 11) % 200 + 1 for i in range(1100)]
CHUNKS = (0, 400, 1000)  # prompt chunks from these positions, then one token a step from 1000


@pytest.mark.parametrize("arch", ["gpt-oss", "gemma3"])
def test_ring_logits_past_the_wrap_equal_llama_cpp(tmp_path, arch):
    path = write_model(tmp_path / f"{arch}.gguf", plan(dataclasses.replace(TINY[arch], n_ctx=2048), "F32"), seed=7)[0]
    m = load_model(path)
    try:
        cache = m.net.new_cache(len(TOKENS))
        assert any(cache.ring)
        ends = CHUNKS[1:] + (CHUNKS[-1] + 1,)
        parts = [m.net(torch.tensor(TOKENS[a:b]), cache) for a, b in zip(CHUNKS, ends)]
        parts += [m.net(torch.tensor(TOKENS[i:i + 1]), cache) for i in range(ends[-1], len(TOKENS))]
        ours = torch.cat(parts).double().numpy()
    finally:
        m.close()
    a = agreement(llama_logits(path, TOKENS), ours)
    print(f"{arch} F32 {len(TOKENS)} positions over rings: {a}")
    assert ours.shape == (len(TOKENS), ours.shape[1]) and np.isfinite(ours).all()
    assert a.rel_err <= 1e-4, a
