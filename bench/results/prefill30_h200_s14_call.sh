#!/usr/bin/env bash
# Session 14 prefill30's call (H200, cold box; carry [".whl", ".xfer/prefill30"]; run from .xfer/prefill30): prompt
# graphs up to 2048 tokens under SDPA (cuda_graphs.prompt_last) and continued prompt graphs on attend_sdpa (a mask
# from the device positions), each side by side with SPARKD_PREFILL_ATTENTION=torch (attend, 1024 the longest
# graph), on the 12-layer Qwen3-30B-A3B-shaped Q4_K GGUF (made as docs/runs/2026-12-01-s13-final/call.sh makes it;
# only Q4_K: the Q8_0 model's ~95 s of writing does not fit the 200 s budget; no llama.cpp build).
# GPU tests first (beside the model's writing), then on a quiet GPU: a two-turn chat's turn 2 (624 and 1648
# tokens) with the prompt cache (prompt_cache_bench.py) sdpa then torch, the prompt graphs captured at load
# (prompt_graphs_load.py --modes auto: load time, pool) sdpa then torch, and the expert sort alone.
# As run (commit 1587ca6, continued graphs on attend_sdpa then, reverted after: see docs/performance.md, prefill30):
# END_S=135, 121.5 s on the box, 156 s of device budget with the cold start (bench/results/prefill30_h200_s14_call_log.txt).
# Results: $OUT/res.tgz (+ $OUT/log.txt).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); END=${END_S:-135}; left() { echo $(( END - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
snap() { cp $R/log.txt $OUT/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
mk() { [ -f $1 ] || { timeout 100 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 \
  --quiet --layers 12 && mv $1.part $1; }; }
(mk $W/q3-12-Q4_K.gguf Q4_K) > $R/make_Q4_K.log 2>&1 & MK4=$!
E=tests/engine
G=("$E/test_fused_kernels.py -k 'attend_sdpa or prefill_attention'"
   "$E/test_cuda_graphs.py -k 'prompt or continued'"
   "$E/test_kernel_engine.py -k 'kernel_path or last_token'"
   "$E/test_prompt_cache.py")
P=()
for i in "${!G[@]}"; do
  eval timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE ${G[$i]} > $R/gpu_tests_$((i+1)).log 2>&1 & P+=($!)
done
for i in "${!P[@]}"; do wait ${P[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/gpu_tests_$((i+1)).log)"; done
grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $R/log.txt; snap
wait $MK4; log "model Q4_K rc $? $(ls -la $W/q3-12-Q4_K.gguf 2>&1 | awk '{print $5}')"
M=$W/q3-12-Q4_K.gguf
for att in sdpa torch; do
  [ $(left) -gt 12 ] || break
  SPARKD_PREFILL_ATTENTION=$att timeout $(( $(left) > 45 ? 40 : $(left) - 4 )) python3 bench/gpu_box/prompt_cache_bench.py \
    --model $M --turn1 512,1536 --reps 3 --json $R/prompt_cache_$att.json > $R/prompt_cache_$att.log 2>&1
  log "prompt cache $att rc $?"; grep -E "^turn|^prompt graphs" $R/prompt_cache_$att.log | tee -a $R/log.txt; snap
done
for att in sdpa torch; do
  [ $(left) -gt 10 ] || break
  SPARKD_PREFILL_ATTENTION=$att timeout $(( $(left) > 30 ? 26 : $(left) - 4 )) python3 bench/gpu_box/prompt_graphs_load.py \
    --model $M --modes auto --tokens 600,2000 --alone 1024,2048 --json $R/prompt_graphs_load_$att.json \
    > $R/prompt_graphs_load_$att.log 2>&1
  log "prompt graphs at load $att rc $?"; tail -6 $R/prompt_graphs_load_$att.log | tee -a $R/log.txt; snap
done
[ $(left) -gt 6 ] && { timeout $(( $(left) - 2 )) python3 bench/gpu_box/expert_sort_bench.py --tokens 512,2048 \
  --json $R/expert_sort.json > $R/expert_sort.log 2>&1; log "expert sort rc $?"; cat $R/expert_sort.log | tee -a $R/log.txt; }
log done; snap
