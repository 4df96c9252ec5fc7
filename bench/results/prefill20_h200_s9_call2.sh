#!/usr/bin/env bash
# Session 9 prefill20's second call (H200, cold box; carry [".whl", ".xfer/prefill20"], run from
# .xfer/prefill20): the first call's prefill_bench runs hit their timeouts (every way slower than
# guessed), so no precision rows and no profile came back. Here: the two 12-layer models, the GPU
# tests of the grouped prefill (now the loop's bits) and of the kernel path with tf32x3, then
# prefill_bench at 512 tokens: Q8_0 every way, profiles of last and tf32x3; Q4_K the precisions.
# llama-bench's numbers are the first call's (same files: make-model is seeded).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res2; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
mk() { [ -f $1 ] || { python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet --layers 12 && mv $1.part $1; }; }
mk $W/q3-12-Q8_0.gguf Q8_0 > /tmp/make8.log 2>&1 &
mk $W/q3-12-Q4_K.gguf Q4_K > /tmp/make4.log 2>&1 &
(nice -n 8 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_kernels.py \
   -k "prefill or grouped" > $R/gpu_tests_1.log 2>&1
 SPARKD_PREFILL_PRECISION=tf32x3 nice -n 8 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE \
   tests/engine/test_kernel_engine.py -k "kernel_path or last_token" > $R/gpu_tests_2.log 2>&1) &
TESTS=$!
bench() {  # quant timeout args...
  local q=$1 t=$2; shift 2
  while [ ! -f $W/q3-12-$q.gguf ]; do sleep 1; done
  (cd bench/gpu_box && timeout $t python3 prefill_bench.py --model $W/q3-12-$q.gguf --json $R/prefill_$q.json "$@") \
    > $R/prefill_$q.log 2>&1
  log "prefill $q rc $?: $(grep -E ' 512 tokens|vs before' $R/prefill_$q.log | tr -s ' ' | tr '\n' ';')"
}
log "start"
bench Q8_0 100 --tokens 512 --profile last,tf32x3
bench Q4_K 60 --tokens 512 --variants last,tf32x3,tf32 --profile last
wait $TESTS; for i in 1 2; do log "tests $i: $(tail -1 $R/gpu_tests_$i.log)"; done
log done
grep -hv USDT $R/prefill_Q8_0.log $R/prefill_Q4_K.log > $OUT/prefill.txt
tar czf $OUT/res2.tgz -C /tmp res2
