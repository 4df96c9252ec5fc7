#!/usr/bin/env bash
# Session 20, moe46, the second call (warm box, right after the first): the first call's winner pick took the 3-group
# tile by a 0.03 us tie, so (1) the engine's 2/1/2/e/2 down with the loads ahead in a second process, interleaved
# (default, ahead, again, ahead) at 4096 and 7168; (2) at 2048 the 2/1/3/e/2 down with and without the loads ahead
# (the first call's -8 % there: the tile or the loads ahead?), as variants and alone.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res2; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res2.tgz -C /tmp res2 2>/dev/null; }
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --sets new --types Q8_0 --no-twins"
timeout 40 $B --defaults-only --shapes 4096x1536x8,7168x2048x8 --variants ahead,again,ahead --json $R/ahead.json \
  > $R/ahead.log 2>&1
log "4096/7168 rc $?"; snap
T=2/1/3/e/2
timeout 35 $B --shapes 2048x768x8 --variants behind@$T:wpvVf,ahead@$T:wpvVfa,behind@$T:wpvVf,ahead@$T:wpvVfa \
  --gate-up "" --down $T:wpvVf,$T:wpvVfa --json $R/w2048.json > $R/w2048.log 2>&1
log "2048 rc $?"; snap
grep -h "all qx\|down " $R/ahead.log $R/w2048.log | cut -c1-150 | tee -a $OUT/log.txt
log done; snap
