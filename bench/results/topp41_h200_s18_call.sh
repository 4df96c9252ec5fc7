#!/usr/bin/env bash
# Ran on commit e0bbc82 (the candidates-first top-p draw; taken out of the engine after the call: it lost on the
# bench model, and the real model's hit rate is below its break-even: docs/performance.md, session 18, topp41).
# Session 18, topp41 (H200, carry [".whl", ".xfer/topp41"], run from .xfer/topp41): top_p < 1 with top_k 0 on the
# device, the candidates first (the fused draw's 64 best tokens; the radix select of c7708ec only where they miss).
#   1. the sampler's GPU tests (test_device_sampler_fused.py -m gpu) while the 12-layer Q4_K model is made
#   2. draw_graph_bench.py: the draw graph alone, top-p path vs torch chain on a flat row (randn * 3: the select
#      runs) and a peaked row (the candidates hold 0.95)
#   3. generate -n 128 a process each, top_p 0.95 / 0.9, before (SPARKD_DEVICE_SAMPLING=chain-top-p: the torch chain)
#      vs after, interleaved, two rounds; between them sampling_bench.py's top-p settings (in-process decode, and
#      how often the candidates held the nucleus on this model)
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
timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_device_sampler_fused.py \
  > $R/gpu_tests.log 2>&1; log "gpu tests rc $?: $(tail -1 $R/gpu_tests.log)"
grep -h "^FAILED\|^ERROR" $R/gpu_tests.log | head -20 | tee -a $OUT/log.txt; snap
timeout 40 python3 bench/gpu_box/draw_graph_bench.py --reps 200 --json $R/draw_graph.json > $R/draw_graph.log 2>&1
log "draw bench rc $?"; cat $R/draw_graph.log >> $OUT/log.txt; snap
wait $MK; log "model $(ls -la $M | awk '{print $5}')"
gen() {  # tag round [env]
  env ${3:-} timeout 25 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda \
    --resident --cuda-graphs on --json --temp 0.8 --top-p ${1#*p} --seed 1 > $R/gen_$1_$2.json 2> $R/gen_$1_$2.err
  log "generate $1 ${3:-after} #$2 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$1_$2.json)"
}
for r in 1 2; do
  for p in 0.95 0.9; do
    [ $(( $(date +%s) - T0 )) -lt 190 ] && gen chain_p$p $r SPARKD_DEVICE_SAMPLING=chain-top-p
    [ $(( $(date +%s) - T0 )) -lt 190 ] && gen new_p$p $r
  done; snap
  if [ $r = 1 ] && [ $(( $(date +%s) - T0 )) -lt 150 ]; then
    PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 35 python3 bench/gpu_box/sampling_bench.py --model $M --json $R/sampling.json \
      --settings "top_p 0.95 top-p path,top_p 0.95 chain-top-p (torch chain),top_p 0.9 top-p path,top_p 0.9 chain-top-p (torch chain)" \
      > $R/sampling.log 2>&1; log "sampling bench rc $?"; cat $R/sampling.log >> $OUT/log.txt; snap
  fi
done
log done; snap
