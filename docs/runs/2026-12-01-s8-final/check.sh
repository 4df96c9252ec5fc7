#!/usr/bin/env bash
# Session 8 check call after making pairx the tiled Q4_K default (warm or cold box, carry [".whl"]):
# the GPU tests that run the tiled Q4_K GEMV through the engine, in 3 parallel groups.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
P=()
run() { timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE "${@:2}" > $OUT/check_$1.log 2>&1 & P+=($!); }
run 1 tests/engine/test_q4_k_tiled.py tests/engine/test_row_tiles.py tests/engine/test_gemv_split.py tests/engine/test_q4t_compact.py
run 2 tests/engine/test_kernel_engine.py tests/engine/test_kernel_determinism.py tests/engine/test_fused_qkv.py
run 3 tests/engine/test_cuda_graphs.py tests/engine/test_device_argmax.py tests/engine/test_q4t_pair.py tests/engine/test_split_fold.py
for j in 0 1 2; do wait ${P[$j]}; echo "group $((j+1)) rc $? $(tail -1 $OUT/check_$((j+1)).log)"; done
