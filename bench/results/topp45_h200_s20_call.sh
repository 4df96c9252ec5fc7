#!/usr/bin/env bash
# Session 20, topp45 (H200, carry [".whl", ".xfer/topp45"], run from .xfer/topp45): the top-p draw's select folded
# (kernels/top_p_select.py: a launch a stage, the last program to finish chooses, the gathering stage draws: 5
# launches a draw instead of 11) against the staged one (SPARKD_TOP_P_SELECT=staged), side by side.
#   1. the sampler's top-p GPU tests (the full-width kept sets and chi-squares: the folded draw is the default)
#      while the 12-layer Q4_K model is made
#   2. draw_graph_bench.py --top-p-only: staged / folded / folded at 2048 bins on flat, peaked, rounded rows
#   3. generate -n 128 a process each: top_p 0.95 and 0.9 staged vs folded, interleaved, then greedy (the
#      reference); no process starts after +135 s (the device budget)
# Ran on a341108, where SPARKD_TOP_P_SELECT and the bench's folded forms existed (taken out in the next commit;
# the bench's --top-p-only now compares 2048 with 4096 bins of the staged select).
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
timeout 45 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE --durations=8 tests/engine/test_device_sampler_fused.py \
  -k "topp or top_p_draws" > $R/gpu_tests.log 2>&1; log "gpu tests rc $?: $(grep -E 'passed|failed' $R/gpu_tests.log | tail -1)"
grep -h "^FAILED\|^ERROR\|Error" $R/gpu_tests.log | head -20 | tee -a $OUT/log.txt; snap
timeout 50 python3 bench/gpu_box/draw_graph_bench.py --top-p-only --reps 200 --json $R/draw_graph.json > $R/draw_graph.log 2>&1
log "draw bench rc $?"; cat $R/draw_graph.log >> $OUT/log.txt; snap
wait $MK; log "model $(ls -la $M | awk '{print $5}')"
gen() {  # tag limit args [env]
  env ${4:-} timeout $2 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda \
    --resident --cuda-graphs on --json $3 > $R/gen_$1.json 2> $R/gen_$1.err
  log "generate $1 ${4:-} rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$1.json) tokens $(python3 -c "import hashlib, json, sys; print(hashlib.md5(str(json.load(open(sys.argv[1]))['tokens']).encode()).hexdigest()[:8])" $R/gen_$1.json 2>/dev/null)"
}
first=45  # the box's first model process compiles the model's kernels
for p in 0.95 0.9; do
  for form in staged folded; do
    [ $(( $(date +%s) - T0 )) -lt 135 ] && { gen ${form}_p$p $first "--temp 0.8 --top-p $p --seed 1" SPARKD_TOP_P_SELECT=$form; first=25; }
  done; snap
done
[ $(( $(date +%s) - T0 )) -lt 135 ] && gen greedy $first "--temp 0"
log done; snap
