#!/usr/bin/env bash
# kda36's second call: the GPU tests of tests/engine/test_kimi_k3.py again after the first call's model test
# asserted that Q8_0's chunked logits differ from the loop's (they were bit-equal); now with CHUNK_CUDA = 64.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
timeout 45 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_kimi_k3.py --durations=4 2>&1 | tee $OUT/gpu_tests2.log | tail -30
