#!/usr/bin/env bash
# Session 9 prefill21's one call (H200, cold box; carry [".whl", ".xfer/prefill21"], run from
# .xfer/prefill21): the integer prefill GEMM (SPARKD_PREFILL_PRECISION=int8). The 12-layer Q8_0
# model made in the background while the GPU tests run (niced), then prefill_bench at 512 tokens:
# last (ieee, the default) vs int8 (and tf32x3) side by side, the int8 profile.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
M=$W/q3-12-Q8_0.gguf
(python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q8_0 --quiet --layers 12 \
   && mv $M.part $M) > $R/make.log 2>&1 &
(nice -n 8 timeout 85 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE tests/engine/test_kernels.py \
   -k "int8 or gemm_matches or prefill" > $R/gpu_tests_1.log 2>&1
 nice -n 8 timeout 60 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE tests/engine/test_kernel_engine.py \
   -k "kernel_path or last_token" > $R/gpu_tests_2.log 2>&1) &
TESTS=$!
log start
while [ ! -f $M ]; do sleep 1; [ $(( $(date +%s) - T0 )) -gt 70 ] && break; done
log "model: $(ls -la $M 2>&1)"
(cd bench/gpu_box && timeout 60 python3 prefill_bench.py --model $M --json $R/prefill_Q8_0.json --tokens 512 \
   --variants last,int8,tf32x3 --profile int8) > $R/prefill_Q8_0.log 2>&1
log "prefill rc $?: $(grep -E ' 512 tokens|profile' $R/prefill_Q8_0.log | tr -s ' ' | tr '\n' ';')"
wait $TESTS; for i in 1 2; do log "tests $i: $(tail -1 $R/gpu_tests_$i.log)"; done
log done
cd /tmp && tar czf $OUT/res.tgz res; cp $R/log.txt $OUT/
