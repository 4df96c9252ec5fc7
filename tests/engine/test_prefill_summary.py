"""bench/gpu_box/prefill_summary.py: llama-bench's prompt rows read past what the CUDA backend
prints first, and the side-by-side table's ratios."""

from __future__ import annotations

import json

from bench_script import load_bench_script

summary = load_bench_script("gpu_box/prefill_summary.py")


def test_llama_rows_after_backend_text_and_ratios(tmp_path):
    llama = tmp_path / "llama.json"
    llama.write_text("ggml_cuda_init: found 1 CUDA devices\n" + json.dumps(
        [{"n_prompt": 512, "n_gen": 0, "avg_ts": 2000.0}, {"n_prompt": 0, "n_gen": 64, "avg_ts": 90.0}]))
    assert summary.llama_pp(str(llama)) == {512: 2000.0}
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps({"model": "m.gguf", "gpu": "H200",
                                "runs": {"before": {"512": {"tok_s": 500.0}}, "last": {"512": {"tok_s": 1000.0}}},
                                "agreement": {"before": {"max_diff_over_max": 0.0, "argmax_equal": True},
                                              "last": {"max_diff_over_max": 2e-6, "argmax_equal": False}}}))
    text = summary.table({"Q8_0": (str(ours), str(llama))})
    assert "| 512 | 500 (0.25) | 1000 (0.50) | 2000 |" in text
    assert "last 2.0e-06 ARGMAX DIFFERS" in text


def test_missing_results_are_said(tmp_path):
    assert summary.llama_pp(str(tmp_path / "none.json")) == {}
    assert "no prefill_bench result" in summary.table({"Q4_K": (str(tmp_path / "none.json"), "")})
