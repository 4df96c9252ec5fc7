#!/usr/bin/env bash
# Session 16 draw32 call (H200, carry [".whl", ".xfer/draw32"], run from .xfer/draw32): the full draw for
# top_k 0 (kernels/sample_draw.full_draw) on the box, in one call of <= ~160 s:
#   the 12-layer Q4_K model made in the background; meanwhile the draw graph alone at 151936 tokens
#   (draw_graph_bench.py: full vs torch chain vs fused top_k 40); then the gpu tests of the sampler files;
#   then decode tok/s in one process (sampling_bench.py, interleaved x2: greedy, top_k 0 full, top_k 0 capped
#   = torch chain, top_k 40 fused); then, while time is left, `generate` a process each (same four).
# Results: $OUT/res.tgz + $OUT/log.txt. Every step has a timeout; END_S bounds the whole call.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); END=${END_S:-150}; left() { echo $(( END - $(date +%s) + T0 )); }
R=/tmp/res; mkdir -p $R
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
timeout 30 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
log "pip rc $?; $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
M=/tmp/q3-12-Q4_K.gguf
(timeout 100 nice -n 10 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K --layers 12 \
  --quiet && mv $M.part $M) > $R/make.log 2>&1 & MK=$!
(cd bench/gpu_box && timeout 45 python3 draw_graph_bench.py --reps 300 --json $R/draw_graph.json) > $R/draw_graph.log 2>&1
log "draw graph rc $?:"; cat $R/draw_graph.log | tee -a $OUT/log.txt; snap
for f in test_device_sampler_fused:60 test_device_sampler:30; do
  timeout ${f#*:} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/${f%:*}.py > $R/gpu_${f%:*}.log 2>&1
  log "gpu tests ${f%:*} rc $?: $(tail -1 $R/gpu_${f%:*}.log)"; grep -h "^FAILED\|^ERROR" $R/gpu_${f%:*}.log | tee -a $OUT/log.txt
done; snap
wait $MK; log "model rc $? $(ls -la $M 2>&1 | awk '{print $5}') after $(( $(date +%s) - T0 ))s"
S="greedy (device argmax),top_k 0 full,top_k 0 capped (torch chain),top_k 40 fused"
(cd bench/gpu_box && timeout $(( $(left) > 60 ? 55 : $(left) - 5 )) python3 sampling_bench.py --model $M --tokens 128 \
  --settings "$S" --repeats 2 --json $R/sampling.json) > $R/sampling.log 2>&1
log "sampling bench rc $?:"; cat $R/sampling.log | tee -a $OUT/log.txt; snap
gen() {  # tag env [flags]
  [ $(left) -gt 21 ] || { log "gen $1 skipped (time)"; return; }
  env $2 timeout 20 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda --resident \
    --cuda-graphs on --json ${@:3} > $R/gen_$1.json 2> $R/gen_$1.err
  log "generate $1 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$1.json)"
}
for r in 1 2; do
  gen full$r SPARKD_DEVICE_SAMPLING=fused --temp 0.8 --seed 1; gen capped$r SPARKD_DEVICE_SAMPLING=capped --temp 0.8 --seed 1
  gen top40_$r SPARKD_DEVICE_SAMPLING=fused --temp 0.8 --top-k 40 --seed 1; gen greedy$r SPARKD_DEVICE_SAMPLING=fused
done
log done; snap
