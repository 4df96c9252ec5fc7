#!/usr/bin/env bash
# Session 11 prefill25's second call (H200, cold box, ~40 s; carry [".whl", ".xfer/prefill25"]): the final
# IGEMM_TILES (each launch measured one by one in call 1) on the GPU: the int8 GEMM tests (grouped == loop,
# s11 == s10 bits, within the bound of the decode's sums), niced, beside igemm_bench's rows (one process a layout,
# 3 calls a row: the bits against s10, rough times while the tests share the GPU), plus candidates for the layouts
# call 1 left out (packed Q8_0, Q6_K grouped, the tiled Q6_K).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res2; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
B="python3 igemm_bench.py --shapes 2048x2048 --grouped 768x2048,2048x768 --tokens 512,2048 --ways s10,s11,64/64/4/4/2/1,64/32/4/1/3/1"
for t in Q4T Q8_0 Q4_K Q8_0P Q6_K Q6T; do
  (cd bench && timeout 34 $B --types $t --grouped-types Q4T,Q8_0,Q4_K,Q6_K --repeats 3 --json $R/igemm_$t.json > $R/igemm_$t.log 2>&1) &
done
nice -n 8 timeout 36 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE tests/engine/test_kernels.py \
   -k "int8_moe_prefill or int8_gemm_is" > $R/gpu_tests.log 2>&1
log "tests rc $?: $(tail -n1 $R/gpu_tests.log)"
wait; log done
cat $R/igemm_*.log > $R/igemm.log; rm -f $R/igemm_*.log
cd /tmp && tar czf $OUT/res2.tgz res2; cp $R/log.txt $OUT/
