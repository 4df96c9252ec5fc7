"""`sparkd-engine serve`: the OpenAI-compatible HTTP server around sparkd.engine.runtime.Engine."""

# top-k where a request sends none (serve --top-k): llama-server's and ollama's 40 (OpenAI's API has no top-k: every
# token). On CUDA, 1-64 draw in the fused kernels (H200: 37 us a draw), 0 takes the torch chain over the whole
# vocabulary (209 us, and a ~170 ms first capture a bucket): docs/engine.md, SPARKD_DEVICE_SAMPLING
DEFAULT_TOP_K = 40
