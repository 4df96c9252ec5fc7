#!/usr/bin/env bash
# Session 8 stream16 call (H200, carry [".whl", ".xfer/stream16"], run from .xfer/stream16): the GPU tests
# of the streamed step's graph segments (and the eager step's) while a smaller streamed model is written
# (--size 6G: the 10G model does not fit the 240 s cap), then streamed decodes under memory.max 3G with no
# VRAM cache (--unified on), session 6's fixed token list, the per-stage profile:
#   before   = --cuda-graphs off (EagerDecode, as main b57356e)
#   after    = the default (SegmentDecode, SPARKD_STREAM_GRAPHS=experts)
#   segments = SPARKD_STREAM_GRAPHS=segments (graphs without the MoE kernels)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=$OUT/r; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W
SIZE=${SIZE:-6G}; SM=$W/q3-stream-$SIZE.gguf
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
pack() { tar czf $OUT/stream16_h200_s8.tgz -C $OUT r -C /tmp stream 2>/dev/null; }
( [ -f $SM ] || { python3 -m sparkd.engine.cli make-model $SM.part --preset qwen3-30b-a3b --quant Q8_0 --quiet --size $SIZE \
  && mv $SM.part $SM; } ) > $R/make.log 2>&1 & M=$!
timeout ${TEST_TIMEOUT:-95} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/streaming/test_graph_step.py \
  tests/engine/streaming/test_eager_step.py > $R/gpu_tests.log 2>&1
log "tests rc $? $(tail -1 $R/gpu_tests.log)"
wait $M; log "model rc $? $(cat $R/make.log | tail -1)"; pack
run() {  # tag [env assignments...]
  local tag=$1; shift
  env "$@" OUT=/tmp/stream/$tag LLAMA=0 QUANTS="" STREAM_SIZE=$SIZE STREAM_BUDGET=3G STREAM_TOKENS=64 STREAM_TIMEOUT=40 \
    DISK_BLOCKS=1M DISK_DEPTHS=8 DISK_SECONDS=1 STREAM_VRAM_BUDGETS=0 bash bench/gpu_box/cuda_side_by_side.sh > $R/stream_$tag.log 2>&1
  log "stream $tag rc $?: $(grep -o '"decode_tok_s": [0-9.]*' /tmp/stream/$tag/engine_*.json 2>/dev/null)"
  cp /tmp/stream/$tag/summary.md $R/stream_$tag.md 2>/dev/null; pack
}
run before STREAM_ARGS="--cuda-graphs off"
run after
[ $(( $(date +%s) - T0 )) -lt ${SEGMENTS_BEFORE_S:-150} ] && run segments SPARKD_STREAM_GRAPHS=segments
log done; pack
