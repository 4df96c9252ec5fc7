#!/usr/bin/env bash
# Session 36, call 5: the F16 / BF16 tile now the default (1 row, 1 warp, 4 groups): their GPU tests (GEMV at the
# default tile, GEMM, MoE, embedding, the engine against the CPU reference) and the trunk term. carry [".whl", ".cache"].
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
export PYTHONPATH=/tmp/site:$PWD
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_kernels.py tests/engine/test_kernel_engine.py \
  tests/engine/streaming/test_vram_cache.py -k "F16 or half or 16_bit or embedding or trunk" 2>&1 | tail -5 | tee $OUT/tests.txt
