#!/usr/bin/env bash
# graphs12's third device call (H200; carry [".whl", ".xfer/graphs12"], run from .xfer/graphs12):
# the three new GPU tests again after call 2 found the out-of-memory test's StaticDecode still going
# through the test's squeezing wrapper, and 33 MiB of cuBLAS workspace left by each warm-up's new side
# stream (graph_capture now keeps one side stream per device).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
timeout 35 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE tests/engine/test_cuda_graphs.py -k "out_of_memory or margin or at_load or graph_replay_equals" > $R/gpu_tests_new.log 2>&1
echo "tests rc $?: $(tail -1 $R/gpu_tests_new.log)" | tee $R/log.txt
grep -h "failed capture:\|prompt graph stats\|^FAILED\|^ERROR\|^E " $R/gpu_tests_new.log | head -30 | tee -a $R/log.txt
cp $R/log.txt $OUT/; cp $R/gpu_tests_new.log $OUT/
