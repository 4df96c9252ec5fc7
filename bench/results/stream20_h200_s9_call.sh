#!/usr/bin/env bash
# Session 9 stream20 call (H200, run from .xfer/stream20 with carry [".whl", ".xfer/stream20"]):
# the 10G Q8_0 streaming model is written in the background while the streamed step's GPU tests
# run (graph replay == eager bits, with and without --prefetch); then streaming runs at memory.max
# 3G on session 6's fixed token list, graphs (SPARKD_STREAM_GRAPHS=experts) and eager (off) side by
# side per VRAM budget, each run its own cuda_side_by_side.sh call (its own disk-bench bound), in
# priority order, none started past LIMIT seconds.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W; R=/tmp/res; mkdir -p $R /tmp/stream
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[+$(el)s] $*" | tee -a $R/log.txt; }
SM=$W/q3-stream-10G.gguf
( python3 -m sparkd.engine.cli make-model $SM.part --preset qwen3-30b-a3b --quant Q8_0 --size 10G --quiet \
  && mv $SM.part $SM ) > $R/make.log 2>&1 & M=$!
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE \
  tests/engine/streaming/test_graph_step.py > $R/gpu_tests.log 2>&1
log "gpu tests rc $? $(tail -1 $R/gpu_tests.log)"
wait $M; log "model rc $? $(tail -1 $R/make.log)"
LIMIT=${LIMIT:-235}
stream() {  # name vram-budget graphs-mode [generate flags]
  local name=$1 vb=$2 mode=$3 args=${4:-}
  if [ "$(el)" -gt "$LIMIT" ]; then log "$name skipped (past ${LIMIT}s)"; return 0; fi
  SPARKD_STREAM_GRAPHS=$mode OUT=/tmp/stream/$name LLAMA=0 QUANTS="" STREAM_TOKENS=${STREAM_TOKENS:-48} \
    STREAM_TIMEOUT=45 DISK_BLOCKS=1M DISK_DEPTHS=8 DISK_SECONDS=1 STREAM_VRAM_BUDGETS=$vb STREAM_ARGS="$args" \
    bash bench/gpu_box/cuda_side_by_side.sh > /tmp/stream/$name.log 2>&1
  log "$name rc $?: $(grep -m1 '| stream_Q8_0' /tmp/stream/$name/summary.md 2>/dev/null)"
  { echo "## $name (SPARKD_STREAM_GRAPHS=$mode, vram $vb, args '$args')"; cat /tmp/stream/$name/summary.md; echo; } \
    >> $R/summaries.md 2>/dev/null
}
stream graphs-0 0 experts; stream eager-0 0 off; stream prefetch-graphs-0 0 experts "--prefetch 16"
stream graphs-2G 2G experts; stream eager-2G 2G off; stream graphs-1G 1G experts; stream eager-1G 1G off
stream prefetch-eager-0 0 off "--prefetch 16"; stream graphs-auto auto experts; stream eager-auto auto off
log done
cp $R/log.txt $R/gpu_tests.log $R/summaries.md $OUT/ 2>/dev/null
tar czf $OUT/res.tgz -C /tmp res stream 2>/dev/null
