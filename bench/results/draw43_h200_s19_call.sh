#!/usr/bin/env bash
# Session 19, draw43 (H200, carry [".whl", ".xfer/draw43"], run from .xfer/draw43): the server's engine captures every
# draw path's graph at load (StaticDecode.capture_draws; SPARKD_LOAD_DRAW_GRAPHS=0: on the first draw, as before).
#   1. the GPU tests of the change (the Engine's load captures against the first-draw ones, seeded tokens of the three
#      paths; generate's prepared draws; the eager bucket's draw; the fused draw's capture) while the 12-layer
#      Qwen3-30B-A3B-shaped Q4_K model is made.
#   2. serve_decode_bench.py (the real openai client), --top-k 0 and top_p 0.95 in the requests, 192 tokens (the
#      prompt plus the reply stay in the first bucket, 256: the one whose step graph the load captures), a fresh
#      server process each, after (the load captures) then before (the switch back), a second round as time allows:
#      the first request's time to first token and decode tok/s from the server's /metrics, its client tok/s, the
#      ready time, the load's log line (each draw graph's capture time and the memory it holds).
# As it ran (call 1): the first server ("after") compiled the 12-layer model's Triton kernels (the box's cache was cold:
# its 2048-token prompt graph took 3.5 s) and the bench's 45 s ran out after its load; the "before" server ran. Call 2, on
# the warm box, ran serve_decode_bench alone, after then before (the command is in draw43_h200_s19_log.txt). A rerun
# should run one untimed server or `generate` first.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W
T0=$(date +%s); END=${END_S:-125}; left() { echo $(( END - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
M=$W/q3-12-Q4_K.gguf
( [ -f $M ] || { nice -n 10 timeout 100 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b \
    --quant Q4_K --quiet --layers 12 && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!
E=tests/engine
timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE -s $E/test_cuda_graphs.py \
  -k "at_load or prepared_draws or eagerly_draws" > $R/tests_graphs.log 2>&1 &  T1=$!
timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $E/test_device_sampler_fused.py -k captured \
  > $R/tests_fused.log 2>&1 & T2=$!
wait $T1; log "tests graphs rc $? $(tail -1 $R/tests_graphs.log)"
wait $T2; log "tests fused rc $? $(tail -1 $R/tests_fused.log)"
grep -h "^FAILED\|^ERROR\|draw graphs at load" $R/tests_*.log | head -20 | tee -a $OUT/log.txt; snap
wait $MK; log "model $(ls -la $M | awk '{print $5}')"
serve() {  # tag round switch
  SPARKD_LOAD_DRAW_GRAPHS=$3 timeout 45 python3 bench/gpu_box/serve_decode_bench.py --model $M --top-k 0 --top-p 0.95 \
    --tokens 192 --reps 2 --server-log $R/serve_$1_$2.err --json $R/serve_$1_$2.json > $R/serve_$1_$2.log 2>&1
  log "serve $1 round $2 rc $?: $(grep top-k $R/serve_$1_$2.log)"
  grep -h "draw graphs at load" $R/serve_$1_$2.err.0 | tee -a $OUT/log.txt; snap
}
for r in 1 2; do
  [ $(left) -gt 40 ] || break; serve after $r 1
  [ $(left) -gt 20 ] || break; serve before $r 0
done
log done; snap
