"""`sparkd-engine serve`: the OpenAI-compatible HTTP server around sparkd.engine.runtime.Engine."""

# top-k where a request sends none (serve --top-k): llama-server's and ollama's 40 (OpenAI's API has no top-k: every
# token). On CUDA (H200) 1-64 draw in the fused kernels (37 us a draw), 0 in the full draw (16.8 us; with top_p < 1
# over its top-p prefix, 86 us; the torch chain over the whole vocabulary 209): docs/engine.md, SPARKD_DEVICE_SAMPLING
DEFAULT_TOP_K = 40
