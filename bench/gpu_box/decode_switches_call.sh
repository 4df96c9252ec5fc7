#!/usr/bin/env bash
# Session 5 step6 in ONE short device call (H200; carry [".whl", ".xfer/step6"]; ~110 s): the model
# is made in the background while the GPU tests of the two cuts (norm_quant, device pick) and the
# CUDA graph tests run, then decode_switches.py times the four settings in one process.
# Knobs: LAYERS=2 (12 is what decode_profile reports; its make takes minutes), TOKENS=128.
set -u
export PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
L=${LAYERS:-2}
M=/tmp/q30-${L}l-Q8_0.gguf
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
[ -f $M ] || { python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --layers $L --quant Q8_0 \
  --quiet && mv $M.part $M; } > $OUT/make.log 2>&1 & MK=$!
timeout ${T1:-35} python3 -m pytest -v -p no:cacheprovider -m gpu tests/engine/test_norm_quant.py \
  tests/engine/test_device_argmax.py > $OUT/gpu_tests_step6.log 2>&1
log "step6 tests rc $? $(tail -1 $OUT/gpu_tests_step6.log)"
timeout ${T2:-35} python3 -m pytest -v -p no:cacheprovider -m gpu tests/engine/test_cuda_graphs.py > $OUT/gpu_tests_graphs.log 2>&1
log "graph tests rc $? $(tail -1 $OUT/gpu_tests_graphs.log)"
timeout 15 python3 bench/gpu_box/rms_norm_fusion_diff.py > $OUT/fusion_diff.txt 2>&1; log "fusion diff rc $? $(head -1 $OUT/fusion_diff.txt)"
wait $MK; log "model: $(tail -1 $OUT/make.log)"
timeout ${T3:-35} python3 bench/gpu_box/decode_switches.py --quant Q8_0 --layers $L --tokens ${TOKENS:-128} \
  --profile-tokens 8 --json $OUT/switches.json > $OUT/switches.txt 2>&1
log "switches rc $?"
