"""The oracle tools themselves, on the real Gemma 3 270M: shapes, and llama.cpp's own
incremental decode agreeing with its all-position logits."""

import numpy as np
import pytest

from llama_oracle import llama_generate, llama_logits, llama_tokenize, llama_tool
from real_models import gemma3_270m

pytestmark = pytest.mark.oracle


def test_unknown_tool_is_refused():
    with pytest.raises(ValueError, match="unknown oracle tool 'nope'"):
        llama_tool("nope")


def test_logits_and_greedy_generation_agree():
    model = gemma3_270m()
    prompt = llama_tokenize(model, "The capital of France is", add_special=True)
    logits = llama_logits(model, prompt)
    assert logits.shape == (len(prompt), 262144) and np.isfinite(logits).all()
    generated = llama_generate(model, prompt, 8, stop_at_eog=False)
    assert len(generated) == 8
    assert generated[0] == int(np.argmax(logits[-1]))
    # teacher-forced: all-position logits over prompt+generated give the same greedy picks
    full = llama_logits(model, prompt + generated[:-1])
    assert np.argmax(full[len(prompt) - 1:], axis=1).tolist() == generated
