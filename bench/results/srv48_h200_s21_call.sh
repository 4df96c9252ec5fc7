#!/usr/bin/env bash
# Session 21, srv48 (H200, carry [".whl", ".xfer/srv48"], run from .xfer/srv48): a fresh top_p server's first request.
# While the 12-layer Qwen3-30B-A3B-shaped Q4_K model is made: the new GPU test (first runs at load: the same
# tokens) and a server on a 1-layer model of the same shapes (it compiles every kernel the servers take into the
# box's Triton cache, so no measured load compiles). Then six fresh servers of the 12-layer model, loaded at once
# (first_request_bench.py: no two serve a request at once), each with SPARKD_TRACE_FIRST=1 (the request's spans,
# the load's first runs): --decode-graphs auto with SPARKD_LOAD_FIRST_RUNS=0 (before) and on (after), twice each,
# lazy (before), auto with SPARKD_LOAD_DRAW_GRAPHS=0 (before); five top_p 0.95 requests of 192 tokens each (the
# first with session 19's prompt, the later ones another first word each: none continues the cache).
# As run at c2826df: SPARKD_LOAD_FIRST_RUNS and the tracer (SPARKD_TRACE_FIRST) came out after the call; what was
# kept, the load's anyio task group, is SPARKD_LOAD_STREAM (docs/performance.md, session 21, srv48).
set -u; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; R=/tmp/res; mkdir -p $W $R $R/c
T0=$(date +%s); END=${END_S:-140}; left() { echo $(( END - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
M=$W/q3-12-Q4_K.gguf; S=$W/q3-1-Q4_K.gguf
( [ -f $M ] || { nice -n 10 timeout 90 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b \
    --quant Q4_K --quiet --layers 12 && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!  # a warm box may have it
timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_decode_graphs.py -k first_runs \
  > $R/gpu_tests.log 2>&1 & TS=$!
[ -f $S ] || timeout 40 python3 -m sparkd.engine.cli make-model $S --preset qwen3-30b-a3b --quant Q4_K --quiet --layers 1 > $R/make1.log 2>&1
log "1-layer model rc $?"
timeout 70 python3 bench/gpu_box/first_request_bench.py --model $S --servers auto --requests 2 --logs $R/c --port 7790 \
  > $R/compile.log 2>&1
log "compile server rc $?: $(tail -2 $R/compile.log | tr '\n' ' ')"; snap
wait $MK; log "model $(ls -la $M 2>&1 | awk '{print $5}')"
timeout $(( $(left) > 40 ? $(left) - 5 : 35 )) python3 bench/gpu_box/first_request_bench.py --model $M --requests 5 --logs $R --stagger 0.5 \
  --servers auto:off:trace,auto:trace,lazy:off:trace,auto:off:trace,auto:trace,auto:draws0:off:trace \
  --json $R/first.json > $R/first.log 2>&1
log "servers rc $?"; cat $R/first.log >> $OUT/log.txt
grep -h "graphs at load\|first runs at load" $R/server_*.log | cut -c1-400 >> $OUT/log.txt; snap
wait $TS; log "gpu tests rc $?: $(tail -1 $R/gpu_tests.log)"
log done; snap
