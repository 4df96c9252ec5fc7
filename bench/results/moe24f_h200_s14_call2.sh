#!/usr/bin/env bash
# Session 14 (moe24f), second call (H200, carry [".whl", ".xfer/moe24f"]): the first call (moe24f_h200_s14_call.sh)
# found the one launch 10-30x slower, its time ~ its programs' sequential steps (2 KiB down steps); here the
# largest steps the registers allow (64 gate/up rows a step, 128-512 down rows), Q8_0 at the three shapes and Q4_K at
# two, beside the default layer; the fused test (bench-only now, GGUF rows: pairx's step finds its tile by the program id).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res2; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res2.tgz -C /tmp res2 2>/dev/null; }
timeout 100 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE tests/engine/test_moe_fused.py > $R/gpu_tests.log 2>&1 & P=$!
Q8="c64g64d256w8u2,c64g64d512w8u1,c64g32d256w8u2,c128g64d256w8u1,c64g64d128w4u2,c64g64d256w8u2nf"
FUSED="$(echo $Q8 | sed 's/\([^,]*\)/Q8_0@\1/g'),Q4_K@c256g32d128w8u1,Q4_K@c256g16d256w8u1"
ARGS="--defaults-only --sets new --no-twins --types Q8_0,Q4_K --shapes 2048x768x8,4096x1536x8,7168x2048x8 --fused $FUSED"
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 80 python3 bench/moe_tiles_bench.py $ARGS --compile-workers 8 --compile-only \
  > $R/compile.log 2>&1
log "compile rc $? $(grep -o 'fused [^ ]*: [A-Za-z]*' $R/compile.log | tr '\n' ' ')"
wait $P; log "tests rc $? $(tail -1 $R/gpu_tests.log)"; grep "err\|^FAILED" $R/gpu_tests.log | tee -a $OUT/log.txt; snap
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 70 python3 bench/moe_tiles_bench.py $ARGS --json $R/moe2.json > $R/moe2.log 2>&1
log "moe rc $?"
grep "all qx\|fused\|FAILED" $R/moe2.log | cut -c1-150 | tee -a $OUT/log.txt
snap
