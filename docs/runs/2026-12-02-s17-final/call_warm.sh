#!/usr/bin/env bash
# Session 17's last call (H200, carry [".whl"]): the draw chains warmed at load (DeviceSampler.warm through
# StaticDecode.warm_sampling, from Engine._finish_load and generate): the sampler's GPU tests and an Engine's
# (prompt cache) while the 12-layer Q4_K model is made, then `generate -n 128` a process each, greedy / top_k 0 / top_k 40 / top_p 0.95, as call.sh's bench
# part ran them before the warm (call_log.txt: 1662.4 / 853.6 / 701.3 / 372.7 tok/s).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W; R=$OUT; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
M=$W/q3-12-Q4_K.gguf
( [ -f $M ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K --quiet \
    --layers 12 && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!
timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_device_sampler_fused.py \
  tests/engine/test_prompt_cache.py > $R/gpu_tests.log 2>&1; log "gpu tests rc $?: $(tail -1 $R/gpu_tests.log)"
grep -h "^FAILED\|^ERROR" $R/gpu_tests.log | tee -a $OUT/log.txt
wait $MK; log "model $(ls -la $M | awk '{print $5}')"
gen() {  # tag [more flags]
  timeout 30 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda --resident \
    --cuda-graphs on --json ${@:2} > $R/gen_$1.json 2> $R/gen_$1.err
  log "decode $1 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$1.json)"
}
gen greedy; gen full --temp 0.8 --seed 1; gen top40 --temp 0.8 --top-k 40 --seed 1; gen topp95 --temp 0.8 --top-p 0.95 --seed 1
log done
