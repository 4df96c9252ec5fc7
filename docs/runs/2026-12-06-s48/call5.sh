#!/usr/bin/env bash
# Session 48, call 5 (carry [".whl"]): the early pairx down ("pearly") at the other widths the Q4_K MoE decode runs
# (7168x2048: DeepSeek V3; 5120x1536; 6144x2048), against the grid-loop default and the down ahead alone ("pahead"),
# and at 4096x1536 on one range more tile (4/1/1/e/4), interleaved in one process per shape set.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
V=pearly,pahead,again,pearly@4/1/2/e/4,pearly@4/1/3/e/4
timeout 250 python3 bench/moe_tiles_bench.py --types Q4_KXD --sets new --shapes 7168x2048x8,5120x1536x8,6144x2048x8 \
  --defaults-only --no-twins --variants $V,$V --compile-workers 8 --json $R/moe_wide.json > $R/moe_wide.txt 2>&1
log "moe wide rc $?"; grep -v Warn $R/moe_wide.txt | grep -E "all qx|copies|FAILED|Error" | cut -c1-200 >> $OUT/log.txt
snap
V=pearly,pearly@4/1/1/e/4,again
timeout 150 python3 bench/moe_tiles_bench.py --types Q4_KXD --sets new --shapes 4096x1536x8 \
  --defaults-only --no-twins --variants $V,$V --compile-workers 8 --json $R/moe4096.json > $R/moe4096.txt 2>&1
log "moe 4096 rc $?"; grep -v Warn $R/moe4096.txt | grep -E "all qx|copies|FAILED|Error|d2d" | cut -c1-200 >> $OUT/log.txt
snap
