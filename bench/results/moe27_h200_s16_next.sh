#!/usr/bin/env bash
# Session 16, moe27, NOT RUN (for the next call; carry [".whl", ".xfer/moe27"], run from .xfer/moe27; ~150 s of command):
# the resident Q4_K gate/up split over x after the pairx tile fix, which the first call (moe27_h200_s16_call.sh)
# measured on the wrong tiles. 1. the layer rows (default, again, split 2 and 4) at the three shapes; 2. the split
# GPU tests; 3. the 12-layer Q4_K decode, default against SPARKD_MOE_TILES=splitk, a process each, interleaved.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
([ -f $W/q3-12-Q4_K.gguf ] || { nice -n 10 timeout 150 python3 -m sparkd.engine.cli make-model $W/q3-12-Q4_K.gguf.part \
  --preset qwen3-30b-a3b --quant Q4_K --quiet --layers 12 && mv $W/q3-12-Q4_K.gguf.part $W/q3-12-Q4_K.gguf; }) \
  > $R/make.log 2>&1 &
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 60 python3 bench/moe_tiles_bench.py --sets new --no-twins --types Q4_KXD \
  --variants again --down "" --gate-up 4/1/1/e/2,4/1/1/e/4 --compile-workers 8 --json $R/moe.json > $R/moe.log 2>&1
log "moe bench rc $?"; snap
timeout 50 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_moe_tiles.py -k split > $R/tests.log 2>&1
log "tests rc $?: $(tail -1 $R/tests.log)"; snap
wait
for r in 1 2; do for way in default splitk; do [ $(( $(date +%s) - T0 )) -lt 140 ] || continue
  env $([ $way = splitk ] && echo SPARKD_MOE_TILES=splitk) timeout 25 python3 -m sparkd.engine.cli generate \
    $W/q3-12-Q4_K.gguf --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda --resident --cuda-graphs on --json \
    > $R/decode_${way}_$r.json 2> $R/decode_${way}_$r.err
  log "decode Q4_K $way #$r rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/decode_${way}_$r.json)"
done; done
log done; snap
