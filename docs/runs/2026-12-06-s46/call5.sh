#!/usr/bin/env bash
# Session 46, call 5 (carry [".whl"]; 30 s): the GPU tests of the MoE slab that call 4's 100 s cut off (4 passed)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
export PYTHONPATH=/tmp/site:$PWD
timeout 110 python3 -m pytest -q -s -p no:cacheprovider -m gpu -n 3 tests/engine/test_slab_gemm.py \
  -k "experts or prompt_graph" 2>&1 | grep -E "slab experts|passed|failed|FAILED|Error" | tail -15
