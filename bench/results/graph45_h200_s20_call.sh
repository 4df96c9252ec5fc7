#!/usr/bin/env bash
# Session 20, graph45 (H200, carry [".whl", ".xfer/graph45"], run from .xfer/graph45): serve --decode-graphs, the
# decode step's buckets (256, 512, ... up to --ctx) captured at load with their draw graphs.
#   1. the GPU tests (auto against lazy against a margin nothing fits under: the same tokens, no step capture in a
#      request crossing 256; the step capture's out-of-memory fallback; the draw graphs at load) while the 12-layer
#      Qwen3-30B-A3B-shaped Q4_K model is made.
#   2. serve_decode_bench.py, a fresh server each: a ~300-token prompt (its first decode step in the 512 bucket) and a
#      256-token reply (it crosses 512 too) at top_k 40, temperature 0.8: the first request's TTFT, decode tok/s and
#      inter-token latencies over 25/50 ms from /metrics, the ready time, the process's device memory, the load's
#      decode graph lines. Order: --ctx 32768 lazy (the first server: it also compiles the model's kernels at load),
#      32768 auto, then 4096 auto and lazy as time allows.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W
T0=$(date +%s); END=${END_S:-115}; left() { echo $(( END - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
M=$W/q3-12-Q4_K.gguf
( [ -f $M ] || { nice -n 10 timeout 100 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b \
    --quant Q4_K --quiet --layers 12 && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!
E=tests/engine
timeout -s INT -k 5 70 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE -s $E/test_decode_graphs.py \
  $E/test_cuda_graphs.py -k "crossing_a_bucket or step_capture_out_of_memory or captured_at_load_give" \
  > $R/tests.log 2>&1
log "tests rc $? $(tail -1 $R/tests.log)"
grep -h "^FAILED\|^ERROR\|/None \[\|/1125899906842624 \[\|decode graphs at load" $R/tests.log | cut -c1-600 \
  | head -20 | tee -a $OUT/log.txt; snap
wait $MK; log "model $(ls -la $M | awk '{print $5}')"
serve() {  # tag ctx mode timeout port
  timeout -s INT -k 5 $4 python3 bench/gpu_box/serve_decode_bench.py --model $M --top-k 40 --prompt-tokens 300 \
    --tokens 256 --reps 1 --port $5 --server-log $R/serve_$1.err --json $R/serve_$1.json -- --device cuda --resident \
    --cuda-graphs on --prompt-graphs 300 --ctx $2 --decode-graphs $3 > $R/serve_$1.log 2>&1
  log "serve $1 rc $?: $(grep top-k $R/serve_$1.log)"
  grep -h "decode graph\|draw graphs at load" $R/serve_$1.err.40 | cut -c1-400 | tee -a $OUT/log.txt; snap
}
serve lazy32k 32768 lazy 60 7791
[ $(left) -gt 24 ] && serve auto32k 32768 auto 35 7792
[ $(left) -gt 24 ] && serve auto4k 4096 auto 35 7793
[ $(left) -gt 24 ] && serve lazy4k 4096 lazy 35 7794
log done; snap
