#!/usr/bin/env bash
# Session 48, call 3 (carry [".whl"]): the pairx down's first step's weight words before its PDL wait ("pearly":
# Kernels.down_early with the pairx down ahead), against the default layer and the down ahead alone ("pahead"), the
# Q4_KXD top-8 decode layer at 4096x1536 (issue 8's open row) and 2048x768, interleaved in one process.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
timeout 280 python3 bench/moe_tiles_bench.py --types Q4_KXD --sets new --shapes 4096x1536x8,2048x768x8 \
  --defaults-only --no-twins --floor --variants pahead,pearly,again,pearly,pahead,pearly --compile-workers 8 \
  --json $R/moe.json > $R/moe.txt 2>&1
log "moe rc $?"; grep -v Warn $R/moe.txt | grep -E "all qx|copy|FAILED|Error|device" >> $OUT/log.txt
snap
