#!/usr/bin/env bash
# Session 9 prefill20 call (H200, cold box; carry [".whl", ".cache", ".xfer/prefill20"], run from
# .xfer/prefill20): llama.cpp's CUDA build and the two 12-layer Qwen3-30B-A3B-shaped models start in
# the background; meanwhile the GPU tests of the prefill paths; then prefill_bench.py per model
# (every way, 128/512/2048 tokens, profiles at 512) while the build runs (niced), llama-bench
# -p 128,512,2048 -n 0 -r 3 on the same files once it is done, and the sparkd runs at 512 again
# with the box quiet. Results: $OUT/summary.md, $OUT/log.txt, $OUT/res.tgz.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
left() { echo $(( ${DEADLINE:-290} - ($(date +%s) - T0) )); }
(OUT=/tmp/bo BUILD_ONLY=1 SDIST=../../.cache/llama_cpp_python-0.3.36.tar.gz nice -n 5 setsid \
  bash bench/gpu_box/cuda_side_by_side.sh > /tmp/build.log 2>&1 &)
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet --layers 12 && mv $1.part $1; }; }
(mk $W/q3-12-Q8_0.gguf Q8_0; log "Q8_0 model written"; mk $W/q3-12-Q4_K.gguf Q4_K; log "Q4_K model written") > /tmp/make.log 2>&1 &
(nice -n 8 timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_kernels.py \
   -k "prefill or grouped or expert_tiles or (gemm_matches and (Q8_0 or Q4_K or Q6_K))" > $R/gpu_tests_1.log 2>&1
 nice -n 8 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_kernel_engine.py \
   tests/engine/test_row_tiles.py tests/engine/test_q4_k_tiled.py tests/engine/test_int_kernels.py -k "gemm or kernel_path or last_token or layout" \
   > $R/gpu_tests_2.log 2>&1) &
TESTS=$!
bench() {  # quant tag timeout args...
  local q=$1 tag=$2 t=$3; shift 3
  while [ ! -f $W/q3-12-$q.gguf ]; do sleep 1; done
  (cd bench/gpu_box && timeout $t python3 prefill_bench.py --model $W/q3-12-$q.gguf --json $R/prefill_${q}_$tag.json "$@") \
    > $R/prefill_${q}_$tag.log 2>&1
  log "prefill $q $tag rc $?: $(grep -E ' 512 tokens' $R/prefill_${q}_$tag.log | tr -s ' ' | tr '\n' ';')"
}
bench Q8_0 all 100 --profile before,last,tf32x3
bench Q4_K all 80 --profile before,last
wait $TESTS; for i in 1 2; do log "tests $i: $(tail -1 $R/gpu_tests_$i.log)"; done
while [ ! -x $W/llama-cuda/llama-bench ] && [ -f $W/llama-building -o ! -f $W/llama_build_seconds.txt ] && [ $(left) -gt 40 ]; do sleep 2; done
log "llama build: $(cat $W/llama_build_seconds.txt 2>/dev/null) $(tail -2 $W/llama_build.txt 2>/dev/null | tr '\n' ' ' | cut -c1-300)"
for q in Q8_0 Q4_K; do
  [ -x $W/llama-cuda/llama-bench ] || break
  timeout 45 $W/llama-cuda/llama-bench -m $W/q3-12-$q.gguf -ngl 99 -p 128,512,2048 -n 0 -r 3 -o json > $R/llama_$q.json 2> $R/llama_$q.err
  log "llama $q rc $?: $(grep -o '"avg_ts": [0-9.e+]*' $R/llama_$q.json | tr '\n' ' ')"
done
for q in Q8_0 Q4_K; do  # the box quiet now: the ways that matter at 512 again
  [ $(left) -gt 25 ] && bench $q quiet 25 --tokens 512 --variants before,last,tf32x3,tf32 --profile "" --repeats 5
done
python3 bench/gpu_box/prefill_summary.py Q8_0=$R/prefill_Q8_0_all.json,$R/llama_Q8_0.json Q4_K=$R/prefill_Q4_K_all.json,$R/llama_Q4_K.json \
  "Q8_0 quiet=$R/prefill_Q8_0_quiet.json,$R/llama_Q8_0.json" "Q4_K quiet=$R/prefill_Q4_K_quiet.json,$R/llama_Q4_K.json" > $OUT/summary.md 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
log done
cp /tmp/build.log /tmp/make.log $W/llama_build.txt $R/ 2>/dev/null
tar czf $OUT/res.tgz -C /tmp res
