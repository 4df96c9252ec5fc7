#!/usr/bin/env bash
# Session 7, branch sample12: the one device call (H200; carry [".whl", ".xfer/sample12"]; run from
# /work/main as `cd .xfer/sample12 && bash bench/results/sample12_h200_s7_call.sh`): the GPU tests
# of the device sampler (torch chain and fused), then sampling_bench.py on the 12-layer Q8_0 model
# with 8 experts per layer (made in the background while the tests run): greedy vs temperature 0.8
# on the host, the torch chain and the fused draw, tok/s, in one process.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
W=/var/tmp/s12; mkdir -p $W
M=$W/q3-12-e8-Q8_0.gguf
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1)"
(nice -n 10 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q8_0 --quiet --layers 12 \
  --experts 8 && mv $M.part $M) > $OUT/make.log 2>&1 &
timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE --durations=8 tests/engine/test_device_sampler_fused.py \
  tests/engine/test_device_sampler.py > $OUT/gpu_tests.log 2>&1
log "tests rc $? $(tail -1 $OUT/gpu_tests.log)"
while [ ! -f $M ] && [ $(( $(date +%s) - T0 )) -lt 60 ]; do sleep 1; done
log "model $(ls -la $M 2>&1)"
timeout 45 python3 bench/gpu_box/sampling_bench.py --model $M --tokens 128 --json $OUT/sampling.json > $OUT/sampling.txt 2>&1
log "sampling rc $?"
