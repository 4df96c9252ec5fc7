#!/usr/bin/env bash
# Session 14, moe25 (H200, carry [".whl", ".xfer/moe25"], run from .xfer/moe25): where the MoE decode's gate/up
# spends its time beyond its load-only twin (engine unchanged; bench/moe_step_probe.py, bench-only).
#   1. bench/moe_tiles_bench.py, Q8_0 at 2048x768 / 4096x1536 / 7168x2048 top-8: the default rows (layer, each
#      launch, twins, same-bytes copies) and 32-row gate/up tiles of 8-16 warps (h's 32-value blocks quantized in
#      the tile: no ticket, no float h round trip; the same warps a program's rows as now, 2-4 rows a warp).
#   2. bench/moe_step_probe.py --float-h: the default gate/up with h quantized (ticket + last program) vs float h
#      only vs its twin; then the same with --narrow (x's words one a thread: the weight loads' layout).
#   3. ncu's counters (stall reasons, L1, issue) of the gate/up, down and twins at 2048x768 Q8_0.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
snap() { tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
timeout 75 python3 bench/moe_tiles_bench.py --sets new --types Q8_0 --shapes 2048x768x8,4096x1536x8,7168x2048x8 \
  --gate-up 32/16/2/e,32/8/1/e,32/16/1/e --down "" --compile-workers 8 --json $R/tiles.json > $R/tiles.log 2>&1
log "tiles bench rc $?"; snap
for n in "" --narrow; do
  timeout 35 python3 bench/moe_step_probe.py --float-h $n --shapes 2048x768x8,4096x1536x8 > $R/floath$n.log 2>&1
  log "float-h $n rc $?"; snap
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 50 $NCU --clock-control none --launch-skip 4 --launch-count 4 -k regex:"igate_up|idown|twin" \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section Occupancy \
  python3 bench/moe_step_probe.py --ncu --shapes 2048x768x8 > $R/ncu.txt 2>&1
log "ncu rc $?"; snap
