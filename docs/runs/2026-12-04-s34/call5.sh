#!/usr/bin/env bash
# Session 34, call 5 (H200, carry [".whl"]): the GPU tests of the kernels and steps this session touched, in full
# (the GEMV launches took new constexprs; the norms, the graphs, the streamed steps). Results: $OUT/res.tgz.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/res; mkdir -p $R
timeout 540 python3 -m pytest -q -p no:cacheprovider -m gpu -x tests/engine/test_kernels.py tests/engine/test_norm_quant.py \
  tests/engine/test_fused_kernels.py tests/engine/test_int_steps.py tests/engine/test_deepseek4_fused.py \
  tests/engine/streaming/test_graph_step.py tests/engine/test_cuda_graphs.py > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
tail -n 5 $R/tests.txt
tar czf $OUT/res.tgz -C /tmp res
