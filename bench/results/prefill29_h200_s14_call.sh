#!/usr/bin/env bash
# Session 14 prefill29's call (H200, cold box; carry [".whl", ".xfer/prefill29"]; run from .xfer/prefill29): the
# prompt's attention through torch's SDPA (attend_sdpa: the memory-efficient kernel, SPARKD_PREFILL_ATTENTION=sdpa)
# against attend's torch ops (=torch, session 13's default) on the 12-layer Qwen3-30B-A3B-shaped GGUFs (made as
# docs/runs/2026-12-01-s13-final/call.sh makes them; no llama.cpp build: the ratios use session 13's llama-bench).
# GPU tests first (beside the models' writing), then on a quiet GPU: the attention alone at one layer's shape
# (prefill_attention_bench.py), the Q4_K prompt at 128/512/1024/2048 tokens, ways interleaved in one process
# (prefill_bench.py: graphs-torch = session 13, int8/graphs = sdpa, graphs2k = sdpa with a 2048
# bucket), profiles at 512 and 2048; Q8_0 the same, time allowing.
# As run (commit 310a10a): END_S=185, 118 s on the box, 156 s of device budget (bench/results/prefill29_h200_s14_call_log.txt).
# Results: $OUT/res.tgz (+ $OUT/log.txt).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); END=${END_S:-190}; left() { echo $(( END - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
snap() { cp $R/log.txt $OUT/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
mk() { [ -f $1 ] || { timeout 100 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 \
  --quiet --layers 12 && mv $1.part $1; }; }
(mk $W/q3-12-Q4_K.gguf Q4_K) > $R/make_Q4_K.log 2>&1 & MK4=$!
(mk $W/q3-12-Q8_0.gguf Q8_0) > $R/make_Q8_0.log 2>&1 & MK8=$!
E=tests/engine
G=("$E/test_fused_kernels.py -k 'attend_sdpa or prefill_attention'"
   "$E/test_cuda_graphs.py -k 'prompt or continued'"
   "$E/test_kernel_engine.py -k 'kernel_path or last_token'"
   "$E/test_prompt_cache.py"
   "$E/test_kernels.py -k 'q4k_gemm_launches'")
P=()
for i in "${!G[@]}"; do
  eval timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE ${G[$i]} > $R/gpu_tests_$((i+1)).log 2>&1 & P+=($!)
done
for i in "${!P[@]}"; do wait ${P[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/gpu_tests_$((i+1)).log)"; done
grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $R/log.txt; snap
timeout 25 python3 bench/gpu_box/prefill_attention_bench.py --tokens 512,1024,2048 --iters 10 --repeats 3 \
  --kernel-max 512 --json $R/attention.json > $R/attention.log 2>&1
log "attention rc $?"; cat $R/attention.log | tee -a $R/log.txt; snap
wait $MK4; log "model Q4_K rc $? $(ls -la $W/q3-12-Q4_K.gguf 2>&1 | awk '{print $5}')"
pre() {  # quant timeout variants profile
  (cd bench/gpu_box && timeout $2 python3 prefill_bench.py --model $W/q3-12-$1.gguf --tokens 128,512,1024,2048 \
    --repeats 3 --variants $3 --profile "$4" --profile-tokens 512,2048 --json $R/prefill_$1.json) > $R/prefill_$1.log 2>&1
  log "prefill $1 rc $?"; grep -E "tokens:|^profile" $R/prefill_$1.log | tee -a $R/log.txt
  grep -E "bit_equal': False" $R/prefill_$1.log | tee -a $R/log.txt; snap
}
pre Q4_K 70 int8,graphs-torch,graphs,graphs2k,graphs-torch,graphs,graphs2k graphs,graphs-torch
wait $MK8; log "model Q8_0 rc $? $(ls -la $W/q3-12-Q8_0.gguf 2>&1 | awk '{print $5}')"
[ $(left) -gt 30 ] && pre Q8_0 $(( $(left) - 3 )) int8,graphs-torch,graphs,graphs-torch,graphs ""
log done; snap
