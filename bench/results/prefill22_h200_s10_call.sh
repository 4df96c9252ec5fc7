#!/usr/bin/env bash
# Session 10 prefill22's one call (H200, cold box; carry [".whl", ".xfer/prefill22"], run from .xfer/prefill22):
# the integer prefill GEMM for the K-quants (Q4_K GGUF + pairx, Q6_K GGUF). The two 12-layer models made in the
# background while the GPU tests run (niced); then, on a quiet GPU, one at a time: igemm_bench (the GEMM per
# layout and tile, int8 vs ieee) and prefill_bench at 512 tokens, Q4_K (ieee `last` vs `int8`, the int8
# profile) and Q8_0 (control). No llama.cpp build (3-4 min of the 350 s budget): session 9's numbers.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
mk() { [ -f $1 ] || { python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet \
  --layers 12 && mv $1.part $1; }; }
(mk $W/q3-12-Q4_K.gguf Q4_K; mk $W/q3-12-Q8_0.gguf Q8_0) > $R/make.log 2>&1 & M=$!
nice -n 8 timeout 100 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE tests/engine/test_kernels.py \
   -k "grouped or prefill or int8" > $R/gpu_tests_1.log 2>&1 & T1=$!
nice -n 8 timeout 100 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE tests/engine/test_kernel_engine.py \
   -k "kernel_path or last_token" > $R/gpu_tests_2.log 2>&1 & T2=$!
log start
wait $T1; log "tests 1 rc $?: $(tail -1 $R/gpu_tests_1.log)"
wait $T2; log "tests 2 rc $?: $(tail -1 $R/gpu_tests_2.log)"
timeout 80 python3 bench/gpu_box/igemm_bench.py --types Q8_0,Q4_K,Q4T,Q6_K --shapes 4096x2048,2048x4096 --tokens 512 \
  --tiles 64/64/4,64/64/8,64/32/4,32/64/4 --tile-types Q4_K,Q4T --json $R/igemm.json > $R/igemm.log 2>&1
log "igemm rc $?"
wait $M; log "models: $(ls -la $W/*.gguf | awk '{print $5}' | tr '\n' ' ')"
for q in Q4_K Q8_0; do
  P=last,int8; [ $q = Q4_K ] && PR=int8 || PR=""
  (cd bench/gpu_box && timeout 50 python3 prefill_bench.py --model $W/q3-12-$q.gguf --tokens 512 --variants $P \
     --profile "$PR" --json $R/prefill_$q.json) > $R/prefill_$q.log 2>&1
  log "prefill $q rc $?: $(grep -E ' 512 tokens|profile' $R/prefill_$q.log | tr -s ' ' | tr '\n' ';')"
done
log done
cd /tmp && tar czf $OUT/res.tgz res; cp $R/log.txt $OUT/
