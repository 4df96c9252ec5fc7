#!/usr/bin/env bash
# Session 44, call 1 (carry [".whl"]): session 43's call 3 (iq2xs_layers.py on the GPU: which module of the IQ2_XS
# model's prompt leaves the CPU reference at ieee; IQ2_XXS, which passes, as the control), then the Q4_KXD layer's
# floor at 4096x1536 top-8 on this card (the baseline for the kernel goal), and layout_twin.py: do the pairx
# experts' byte orders bound the layer's loads (load-only twins in three orders)?
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
for q in IQ2_XS IQ2_XXS; do
  SPARKD_PREFILL_GRAPHS=0 timeout 150 python3 docs/runs/2026-12-06-s43/iq2xs_layers.py $q 2>&1 | grep -v Warn > $R/layers_$q.txt
  log "layers $q rc $?"; cat $R/layers_$q.txt >> $OUT/log.txt
done
snap
timeout 120 python3 docs/runs/2026-12-06-s44/layout_twin.py --gu-steps 2,4 --down-steps 3,6 > $R/twin.txt 2>&1
log "twin rc $?"; cat $R/twin.txt >> $OUT/log.txt
snap
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 200 python3 bench/moe_tiles_bench.py --types Q4_KXD --sets new \
  --shapes 4096x1536x8 --floor --defaults-only --compile-workers 14 --json $R/floor.json > $R/floor.txt 2>&1
log "floor rc $?"; cat $R/floor.txt >> $OUT/log.txt
snap
