#!/usr/bin/env bash
# Ran on commit c71adb0 (moe_one and the bench's --one rows; taken out of the engine after this call: see docs/performance.md, session 20, moe45).
# Session 20, moe45, second call (H200, carry [".whl", ".xfer/moe45"], run from .xfer/moe45): after the first call
# (moe45_h200_s20_call.sh: the one launch 1.4-1.5x slower than the two launches, its bits the same at 4096/7168), why:
#   1. bench/moe_tiles_bench.py at 4096x1536 / 2048x768 / 7168x2048 top-8 Q8_0: the default layer "all qx" (and again),
#      the two launches with the 4/1/1/e/8 down, and the one launch (its spin now on volatile loads, one acquire) with
#      each launch's gate/up tiles alone and down tiles alone (--one-phases): all resident (32: at most the resident,
#      twice), 16 and 8 an SM, the down's whole row a step (4096: /6, 7168: /8, 2048 with 4/1/1/e/8: /3), the 4/1/1/e/8
#      down.
#   2. the GPU tests: test_moe_one (bits at the three widths; 2048 with a 2/1/1/e/2 down), test_moe_pipe.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res2; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res2 2>/dev/null; }
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 120 python3 bench/moe_tiles_bench.py --sets new --types Q8_0 --no-twins \
  --gate-up "" --down 4/1/1/e/8 --compile-workers 8 --shapes 4096x1536x8,2048x768x8,7168x2048x8 --variants again \
  --one 32,16,8,32/4/6,32/4/8,32/4/3@4/1/1/e/8,32@4/1/1/e/8,32 --one-phases --json $R/moe.json > $R/moe.log 2>&1
log "bench rc $?"; grep -h "all qx\|only\|FAILED" $R/moe.log | tee -a $OUT/log.txt; snap
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_moe_one.py tests/engine/test_moe_pipe.py \
  > $R/tests.log 2>&1
log "tests rc $?: $(tail -1 $R/tests.log)"; grep -h "^FAILED\|^ERROR\|Error" $R/tests.log | head -20 | tee -a $OUT/log.txt
log done; snap
