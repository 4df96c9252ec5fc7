#!/usr/bin/env bash
# Session 19, moe44, the second call (the first's machine was taken back before it returned anything): the 4096
# rows only, trimmed to the budget left. moe_tiles_bench.py at 4096x1536 top-8 Q8_0: the engine's layer (and again)
# against the layer and the down with the down's pipe (16 / 32 an SM at the engine's 2/1/2/e/2, 8 an SM at one range
# 2/1/2/e/1, 16 at 3-group steps 2/1/3/e/2); then test_moe_pipe.py's down bits test at the three widths.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --defaults-only --sets new --types Q8_0 --no-twins"
timeout 45 $B --compile-workers 8 --shapes 4096x1536x8 --variants again \
  --pipe-down 16,32,8@2/1/2/e/1,16@2/1/3/e/2 --json $R/pipe.json > $R/pipe.log 2>&1
log "4096 bench rc $?"; snap
timeout 25 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_moe_pipe.py -k down > $R/tests.log 2>&1
log "tests rc $?: $(tail -1 $R/tests.log)"; snap
grep -h "all qx\|down" $R/pipe.log | cut -c1-160 | tee -a $OUT/log.txt
log done; snap
