#!/usr/bin/env bash
# Session 19, topp42 (H200, carry [".whl", ".xfer/topp42"], run from .xfer/topp42): top_p < 1 with top_k 0 on the device,
# the cut found by kernels/top_p_select.py (histogram stages, no sort) instead of the torch chain.
#   1. the sampler's GPU tests (test_device_sampler_fused.py -m gpu, the top-p, full and captured ones: the fused
#      candidates' code did not change) while the 12-layer Q4_K model is made
#   2. draw_graph_bench.py: the draw graph alone, top-p path vs torch chain on flat, peaked and rounded rows
#   3. generate -n 128 a process each, top_p 0.95 / 0.9, before (SPARKD_DEVICE_SAMPLING=chain-top-p: the torch
#      chain) vs after, interleaved, two rounds (no new process after +165 s: the device budget)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
M=$W/q3-12-Q4_K.gguf
( [ -f $M ] || { nice -n 10 timeout 120 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b \
    --quant Q4_K --quiet --layers 12 && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!
timeout 85 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE --durations=6 tests/engine/test_device_sampler_fused.py \
  -k "top_p or full or captured" > $R/gpu_tests.log 2>&1; log "gpu tests rc $?: $(grep -E 'passed|failed' $R/gpu_tests.log | tail -1)"
grep -h "^FAILED\|^ERROR\|Error" $R/gpu_tests.log | head -20 | tee -a $OUT/log.txt; snap
timeout 35 python3 bench/gpu_box/draw_graph_bench.py --reps 200 --json $R/draw_graph.json > $R/draw_graph.log 2>&1
log "draw bench rc $?"; cat $R/draw_graph.log >> $OUT/log.txt; snap
wait $MK; log "model $(ls -la $M | awk '{print $5}')"
gen() {  # tag round limit [env]
  env ${4:-} timeout $3 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda \
    --resident --cuda-graphs on --json --temp 0.8 --top-p ${1#*p} --seed 1 > $R/gen_$1_$2.json 2> $R/gen_$1_$2.err
  log "generate $1 ${4:-after} #$2 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$1_$2.json) tokens $(python3 -c "import hashlib, json, sys; print(hashlib.md5(str(json.load(open(sys.argv[1]))['tokens']).encode()).hexdigest()[:8])" $R/gen_$1_$2.json 2>/dev/null)"
}
first=45  # the box's first model process compiles the model's kernels
for r in 1 2; do
  for p in 0.95 0.9; do
    [ $(( $(date +%s) - T0 )) -lt 165 ] && { gen chain_p$p $r $first SPARKD_DEVICE_SAMPLING=chain-top-p; first=25; }
    [ $(( $(date +%s) - T0 )) -lt 165 ] && gen new_p$p $r 25
  done; snap
done
log done; snap
