#!/usr/bin/env bash
# Session 17 draw33 call, as run on commit c7708ec (its top-p path and the chain-top-p mode were taken out after it:
# 4.2x slower than the torch chain; docs/performance.md "Session 17: top_p < 1 ...") (H200, carry [".whl", ".xfer/draw33"],
# run from .xfer/draw33): the top-p draw for top_k 0
# with top_p < 1 (kernels/sample_draw.top_p_draw) on the box, in one call of <= ~190 s:
#   the 12-layer Q4_K model made in the background; meanwhile the draw graph alone at 151936 tokens
#   (draw_graph_bench.py: top-p path vs torch chain vs full vs fused top_k 40), then the fused sampler's gpu tests;
#   then decode tok/s in one process (sampling_bench.py, interleaved x2: greedy, top_k 0 full, top_p 0.95 on the
#   top-p path and on the torch chain (chain-top-p), each with its first draw's time); `generate` a process each;
#   the server's streamed decode (top_k 0 with top_p 0.95, top_k 0 full, capped, top_k 40) while time is left.
# Results: $OUT/res.tgz + $OUT/log.txt. Every step has a timeout; END_S bounds the whole call.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); END=${END_S:-185}; left() { echo $(( END - $(date +%s) + T0 )); }
R=/tmp/res; mkdir -p $R
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
timeout 30 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
log "pip rc $?; $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
M=/tmp/q3-12-Q4_K.gguf
(timeout 100 nice -n 10 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K --layers 12 \
  --quiet && mv $M.part $M) > $R/make.log 2>&1 & MK=$!
(cd bench/gpu_box && timeout 50 python3 draw_graph_bench.py --reps 300 --json $R/draw_graph.json) > $R/draw_graph.log 2>&1
log "draw graph rc $?:"; cat $R/draw_graph.log | tee -a $OUT/log.txt; snap
timeout 70 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE --durations=8 tests/engine/test_device_sampler_fused.py \
  > $R/gpu_tests.log 2>&1
log "gpu tests rc $?: $(tail -1 $R/gpu_tests.log)"; grep -h "^FAILED\|^ERROR" $R/gpu_tests.log | tee -a $OUT/log.txt; snap
wait $MK; log "model rc $? $(ls -la $M 2>&1 | awk '{print $5}')"
S="greedy (device argmax),top_k 0 full,top_p 0.95 top-p path,top_p 0.95 chain-top-p (torch chain)"
(cd bench/gpu_box && timeout 55 python3 sampling_bench.py --model $M --tokens 128 --settings "$S" --repeats 2 \
  --json $R/sampling.json) > $R/sampling.log 2>&1
log "sampling bench rc $?:"; cat $R/sampling.log | tee -a $OUT/log.txt; snap
gen() {  # tag mode [flags]
  [ $(left) -gt 16 ] || { log "gen $1 skipped (time)"; return; }
  SPARKD_DEVICE_SAMPLING=$2 timeout 15 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda \
    --resident --cuda-graphs on --json ${@:3} > $R/gen_$1.json 2> $R/gen_$1.err
  log "generate $1 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$1.json)"
}
serve() {  # tag mode [bench flags]
  [ $(left) -gt 30 ] || { log "serve $1 skipped (time)"; return; }
  SPARKD_DEVICE_SAMPLING=$2 timeout $(( $(left) > 45 ? 40 : $(left) - 5 )) python3 bench/gpu_box/serve_decode_bench.py \
    --model $M --tokens 128 --reps 2 --json $R/serve_$1.json ${@:3} > $R/serve_$1.log 2>&1
  log "serve $1 rc $?: $(grep top-k $R/serve_$1.log)"
}
gen greedy1 fused; gen full1 fused --temp 0.8 --seed 1; gen topp1 fused --temp 0.8 --top-p 0.95 --seed 1
gen chain1 chain-top-p --temp 0.8 --top-p 0.95 --seed 1; snap
serve topp fused --top-k 0 --top-p 0.95; serve full fused --top-k 0; serve capped capped --top-k 0; serve top40 fused --top-k 40
snap
gen topp2 fused --temp 0.8 --top-p 0.95 --seed 2; gen chain2 chain-top-p --temp 0.8 --top-p 0.95 --seed 2
gen full2 fused --temp 0.8 --seed 2; gen greedy2 fused
log done; snap
