#!/usr/bin/env bash
# Session 48, call 8 (carry [".whl"]): issue 8's kernel row at the final code, the MoE top-8 decode layers after the norm
# ("all qx") at the three shapes for Q8_0 and Q4_KXD, the defaults with the floor rows, in two processes.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
for p in 1 2; do
  timeout 140 python3 bench/moe_tiles_bench.py --types Q8_0,Q4_KXD --sets new --shapes 2048x768x8,4096x1536x8,7168x2048x8 \
    --defaults-only --no-twins --floor --variants again --compile-workers 8 --json $R/moe$p.json > $R/moe$p.txt 2>&1
  log "moe $p rc $?"; grep -v Warn $R/moe$p.txt | grep -E "all qx|floor:|FAILED|Error|d2d" | cut -c1-140 >> $OUT/log.txt
  snap
done
