#!/usr/bin/env bash
# Session 13, after the final call (H200, cold box, carry [".whl"]): the 12-layer Q8_0 resident decode fell
# from 1309 (session 12) to 1261 tok/s in the final call's side-by-side; moe23's SPARKD_MOE_DOWN_LAUNCH=auto
# (the gate/up lets the down launch after its loop below width 4096) also covers this Q8_0 model and its decode
# was never timed. A process each, interleaved: auto (default) vs start (session 12), 3 rounds.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
M=/var/tmp/q3-12-Q8_0.gguf
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
timeout 90 python3 -m sparkd.engine.cli make-model $M --preset qwen3-30b-a3b --quant Q8_0 --quiet --layers 12
log "model rc $?"
for r in 1 2 3; do for way in auto start; do
  SPARKD_MOE_DOWN_LAUNCH=$way timeout 40 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 128 \
    --device cuda --resident --cuda-graphs on --json > $OUT/decode_${way}_$r.json 2> $OUT/decode_${way}_$r.err
  log "decode Q8_0 $way #$r rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $OUT/decode_${way}_$r.json)"
done; done
