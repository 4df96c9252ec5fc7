#!/usr/bin/env bash
# Session 47, call 7 (carry [".whl"]): the final code's GPU tests of the slabs and the prompt graphs (call 6's run was
# cut at 150 s; the word-load dequants it timed are reverted).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
export PYTHONPATH=/tmp/site:$PWD
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_slab_gemm.py \
  tests/engine/test_prompt_cache.py -rA > $OUT/tests.txt 2>&1
echo "tests rc $? $(tail -n 1 $OUT/tests.txt)"; grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -20
grep -c PASSED $OUT/tests.txt
