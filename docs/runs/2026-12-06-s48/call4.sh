#!/usr/bin/env bash
# Session 48, call 4 (carry [".whl"]): the early pairx down at other tiles (its first step 2 or 3 groups, 2 / 4 / 8
# ranges) and with the range's tiles prefetched into the L2 before the wait too ("pearly2"), Q4_KXD top-8 decode
# layers at 4096x1536 and 2048x768, interleaved in one process.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
V=pearly,pearly2,pearly@4/1/3/e/4,pearly@4/1/3/e/8,pearly@4/1/2/e/8,pearly@4/1/3/e/2,pearly@4/1/1/e/8,pahead
timeout 280 python3 bench/moe_tiles_bench.py --types Q4_KXD --sets new --shapes 4096x1536x8 \
  --defaults-only --no-twins --variants $V,$V --compile-workers 8 --json $R/moe4096.json > $R/moe4096.txt 2>&1
log "moe 4096 rc $?"; grep -v Warn $R/moe4096.txt | grep -E "all qx|copies|FAILED|Error|device" | cut -c1-200 >> $OUT/log.txt
snap
V=pearly,pearly2,pearly@4/1/3/e/4,pearly@4/1/1/e/8,pearly@4/1/3/e/1,pahead
timeout 200 python3 bench/moe_tiles_bench.py --types Q4_KXD --sets new --shapes 2048x768x8 \
  --defaults-only --no-twins --variants $V,$V --compile-workers 8 --json $R/moe2048.json > $R/moe2048.txt 2>&1
log "moe 2048 rc $?"; grep -v Warn $R/moe2048.txt | grep -E "all qx|copies|FAILED|Error" | cut -c1-200 >> $OUT/log.txt
snap
