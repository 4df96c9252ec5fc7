#!/usr/bin/env bash
# Session 6 sample9 in ONE short device call (H200; carry [".whl", ".xfer/sample9"]; END=85 s): the
# 12-layer model is made in the background (Qwen3-30B-A3B shape, full vocabulary, Q8_0, 8 experts
# per layer so the make fits the call; an issue8_call.sh 128-expert model already on the box is
# used instead) while the GPU tests of the device sampler and the device argmax run; then
# sampling_bench.py times greedy vs temperature 0.8 on the host vs on the device.
set -u
export PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
M=/var/tmp/sparkd-cuda/q3-12-Q8_0.gguf MK=
if [ ! -f $M ]; then
  M=/tmp/q30-12l-e8-Q8_0.gguf
  { python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --layers 12 --experts 8 \
    --quant Q8_0 --quiet && mv $M.part $M; } > $OUT/make.log 2>&1 & MK=$!
fi
timeout ${T1:-45} python3 -m pytest -v -p no:cacheprovider -m gpu tests/engine/test_device_sampler.py \
  tests/engine/test_device_argmax.py -k "not norm_quant" > $OUT/gpu_tests.log 2>&1
log "gpu tests rc $? $(tail -1 $OUT/gpu_tests.log)"
[ -n "$MK" ] && wait $MK; log "model $M: $(tail -1 $OUT/make.log 2>/dev/null)"
timeout $(( ${END:-85} - $(date +%s) + T0 )) python3 bench/gpu_box/sampling_bench.py --model $M --tokens ${TOKENS:-128} \
  --json $OUT/sampling.json > $OUT/sampling.txt 2>&1
log "bench rc $?"
