#!/usr/bin/env bash
# Session 6 sample9's short second call (H200; carry [".whl", ".xfer/sample9"]; ~30 s on a warm
# box): the draw graph alone with the spelled-out softmax vs torch.softmax, then the device
# sampler's GPU tests (the captured draw first).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
timeout 12 python3 bench/gpu_box/draw_graph_bench.py --json $OUT/draw_graph.json > $OUT/draw_graph.txt 2>&1
log "draw graph rc $?"
F=tests/engine/test_device_sampler.py
timeout ${T1:-25} python3 -m pytest -v -p no:cacheprovider -m gpu $F::test_captured_draw_equals_the_eager_draw_and_repeats \
  $F > $OUT/gpu_tests2.log 2>&1
log "gpu tests rc $? $(tail -1 $OUT/gpu_tests2.log)"
