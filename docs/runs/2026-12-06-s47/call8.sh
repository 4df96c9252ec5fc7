#!/usr/bin/env bash
# Session 47, call 8 (carry [".whl"]): SLAB_EXPERT_ROWS_LOOPED (512) where torch._grouped_mm has no fused kernel
# (float16 slabs, compute capability 8.x / 12.x): the slab tests on the GPU.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_slab_gemm.py -rA > $OUT/tests.txt 2>&1
echo "tests rc $? $(tail -n 1 $OUT/tests.txt)"; grep -E "^(FAILED|ERROR)|^E " $OUT/tests.txt | head -20
