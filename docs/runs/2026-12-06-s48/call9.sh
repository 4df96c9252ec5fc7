#!/usr/bin/env bash
# Session 48, call 9 (carry [".whl"], asked for nvidia-h200: whichever card came): issue 8's kernel row at the final
# code on a fresh machine, the MoE top-8 decode layers after the norm at three shapes for Q8_0 and Q4_KXD (defaults,
# floor rows), and at 4096x1536 Q4_KXD the early down against "pahead" (the wait first) interleaved.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
timeout 140 python3 bench/moe_tiles_bench.py --types Q8_0,Q4_KXD --sets new --shapes 2048x768x8,4096x1536x8,7168x2048x8 \
  --defaults-only --no-twins --floor --compile-workers 8 --json $R/moe.json > $R/moe.txt 2>&1
log "moe rc $?"; grep -v Warn $R/moe.txt | grep -E "all qx|floor:|FAILED|Error|d2d" | cut -c1-140 >> $OUT/log.txt
snap
timeout 100 python3 bench/moe_tiles_bench.py --types Q4_KXD --sets new --shapes 4096x1536x8 --defaults-only \
  --no-twins --variants pahead,again,pahead,again --json $R/moe4096.json > $R/moe4096.txt 2>&1
log "moe 4096 rc $?"; grep -v Warn $R/moe4096.txt | grep -E "all qx|d2d" | cut -c1-140 >> $OUT/log.txt
snap
