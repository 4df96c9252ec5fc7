#!/usr/bin/env bash
# Session 14's second final call (H200, cold box, carry [".whl"]): the first call's tests part (call.sh PART=tests)
# found group 10 (test_cuda_graphs, test_prompt_cache) failing on a bug of the lead's SDPA rule (a continued graph's
# start is a device tensor); after its fix, this call re-runs that group, then the prompt benches on the merged main:
# prefill_bench for Q4_K and Q8_0 (SDPA, the default, against session 13's attention, SPARKD_PREFILL_ATTENTION=torch,
# a process each) and the prompt store A/B. No llama.cpp build (no device time left for it): the llama.cpp ratios use
# session 13's llama-bench numbers (same box type; the docs say so).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); END=${END_S:-220}; left() { echo $(( END - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet --layers 12 && mv $1.part $1; }; }
(mk $W/q3-12-Q4_K.gguf Q4_K) > $R/make_Q4_K.log 2>&1 & M4=$!
(mk $W/q3-12-Q8_0.gguf Q8_0) > $R/make_Q8_0.log 2>&1 & M8=$!
E=tests/engine
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $E/test_cuda_graphs.py $E/test_prompt_cache.py > $R/gpu_tests_10.log 2>&1
log "tests group 10 rc $? $(tail -1 $R/gpu_tests_10.log)"; grep -h "^FAILED\|^ERROR" $R/gpu_tests_10.log | tee -a $OUT/log.txt; snap
pre() {  # quant seconds [env]
  (cd bench/gpu_box && env $3 timeout $2 python3 prefill_bench.py --model $W/q3-12-$1.gguf --tokens 128,512,1024,2048 \
    --variants graphs,graphs --json $R/prefill_$1_$4.json) > $R/prefill_$1_$4.log 2>&1
  log "prefill $1 $4 rc $?: $(grep -E ' (128|512|1024|2048) tokens' $R/prefill_$1_$4.log | tr -s ' ' | tr '\n' ';')"; snap
}
wait $M4; log "model Q4_K rc $?"
pre Q4_K 45 "" sdpa; pre Q4_K 45 SPARKD_PREFILL_ATTENTION=torch s13
wait $M8; log "model Q8_0 rc $?"
[ $(left) -gt 70 ] && { pre Q8_0 35 "" sdpa; pre Q8_0 35 SPARKD_PREFILL_ATTENTION=torch s13; }
[ $(left) -gt 30 ] && { timeout $(( $(left) - 3 )) python3 bench/gpu_box/prompt_cache_bench.py --model $W/q3-12-Q8_0.gguf --ab \
  --turn1 512,1536 --reps 3 --json $R/prompt_store_ab.json > $R/prompt_store_ab.log 2>&1
  log "prompt store A/B rc $?: $(tail -6 $R/prompt_store_ab.log | tr '\n' ';')"; }
log done; snap
