#!/usr/bin/env bash
# Session 15, branch step26 (H200, carry [".whl", ".xfer/step26"], run from .xfer/step26): where a resident decode
# step's time goes outside the MoE launches. The two 12-layer Qwen3-30B-A3B-shaped test models (made in parallel),
# then bench/gpu_box/decode_kernels.py: the three timed loops (next_token as generate runs it, without the two
# fills, replays alone) and the per-kernel table of 16 profiled steps; PDL on (default) for both models, then
# PDL off for both (how much of the idle time between kernels PDL hides). Results: $OUT/res.tgz + $OUT/log.txt.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
mk() { timeout 100 python3 -m sparkd.engine.cli make-model $1 --preset qwen3-30b-a3b --quant $2 --quiet --layers 12; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/smi.txt 2>&1
mk $W/q3-12-Q8_0.gguf Q8_0 > $R/make_q8.log 2>&1 & A=$!
mk $W/q3-12-Q4_K.gguf Q4_K > $R/make_q4.log 2>&1 & B=$!
wait $A; wait $B; log "models $(ls -la $W/*.gguf | awk '{print $5}' | tr '\n' ' ')"
timeout 100 python3 bench/gpu_box/decode_kernels.py $W/q3-12-Q8_0.gguf $W/q3-12-Q4_K.gguf --json $R/pdl_on.json \
  > $R/pdl_on.log 2>&1
log "pdl on rc $?"; cat $R/pdl_on.log | grep -v Warning; snap
SPARKD_PDL=off timeout 70 python3 bench/gpu_box/decode_kernels.py $W/q3-12-Q8_0.gguf $W/q3-12-Q4_K.gguf --rounds 2 \
  --json $R/pdl_off.json > $R/pdl_off.log 2>&1
log "pdl off rc $?"; grep -v Warning $R/pdl_off.log | head -30; snap
