#!/usr/bin/env bash
# q6t10 (session 10): the GPU tests of q6_k_tiled's integer prefill GEMM (iblock / igroup) and the lead's
# 469e399 test fixes, in 4 parallel pytest processes. Run from .xfer/q6t10 with carry [".whl", ".xfer/q6t10"].
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
E=tests/engine
run() { timeout ${TEST_TIMEOUT:-125} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE --durations=5 "${@:2}" > $OUT/$1.log 2>&1; echo "$1 rc $?" >> $OUT/rc.txt; }
run row_tiles $E/test_row_tiles.py & 
run kernels $E/test_kernels.py -k "int8 or moe_decode_matches_reference" &
run eager_q6t $E/test_eager_decode.py $E/test_q6_k_tiled.py &
run kernel_engine $E/test_kernel_engine.py -k "kernel_path or last_token" &
wait
cat $OUT/rc.txt; for f in $OUT/*.log; do echo "== $f"; grep -E "passed|failed|FAILED|ERROR|int8 GEMM vs igemv \(q6_k" $f | tail -8; done
