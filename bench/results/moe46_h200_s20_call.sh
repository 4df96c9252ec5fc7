#!/usr/bin/env bash
# Session 20, moe46 (H200, carry [".whl", ".xfer/moe46"], run from .xfer/moe46; ran on 1216a41): the Q8_0 MoE down's
# loop with the next step's words loaded before this step's dots (moe_down_ahead; Kernels.down_ahead, not yet a default).
#   1. moe_tiles_bench at 4096x1536 top-8 Q8_0: the engine's layer ("default"), then variants again / ahead
#      interleaved (the engine's 2/1/2/e/2 down with and without the loads ahead), --floor, then the down tiles with
#      the loads ahead (flag a): the engine's, 4 rows, 2-warp programs (2 and 4 rows), 3-group steps; each alone,
#      as the whole layer and as "all qx".
#   2. a second process: the winner of 1's "all qx" rows (ahead at its tile) interleaved: default, cand, again, cand.
#   3. 7168x2048 and 2048x768: default, winner, again, winner (2048's default down, 4/1/1/g/8, a per-group reduction,
#      does not take the loop: its rows are the drift).
#   4. the GPU tests: the down ahead's bits (4096 / 7168 / 2048, 1 and 2 warps), and the MoE tests of the code
#      touched (_idown_kernel's loop, moe_tiles).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --sets new --types Q8_0 --no-twins"
CANDS=2/1/2/e/2:wpvVfa,4/1/2/e/2:wpvVfa,4/2/2/e/2:wpvVfa,2/2/2/e/2:wpvVfa,2/1/3/e/2:wpvVfa
timeout 90 $B --compile-workers 8 --shapes 4096x1536x8 --variants again,ahead,again,ahead --floor --gate-up "" \
  --down $CANDS --json $R/moe4096.json > $R/moe4096.log 2>&1
log "4096 bench rc $?"; snap
# the winner: the fastest "all qx" mean among the ahead rows (the default tile's variant or a flag-a tile)
W=$(python3 - <<'PY'
import json, statistics
try:
    rows = json.load(open("/tmp/res/moe4096.json"))["rows"]
except Exception:
    rows = []
us = {}
for r in rows:
    if r["kernel"].endswith(" all qx") and (r["config"] == "default ahead" or r["config"].endswith(":wpvVfa")):
        key = "ahead" if r["config"] in ("default ahead", "2/1/2/e/2:wpvVfa") else "ahead@" + r["config"]
        us.setdefault(key, []).append(r["us"])
print(min(us, key=lambda k: statistics.mean(us[k])) if us else "ahead")
PY
)
log "winner $W"
timeout 40 $B --defaults-only --shapes 4096x1536x8 --variants $W,again,$W --json $R/again4096.json \
  > $R/again4096.log 2>&1
log "4096 second process rc $?"; snap
timeout 55 $B --defaults-only --compile-workers 8 --shapes 2048x768x8,7168x2048x8 --variants again,$W,again,$W \
  --json $R/widths.json > $R/widths.log 2>&1
log "widths bench rc $?"; snap
E=tests/engine
G=("$E/test_moe_down_ahead.py"
   "$E/test_moe_tiles.py $E/test_moe_decode_fusion.py")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt; snap
grep -h "all qx\|down \|floor" $R/moe4096.log $R/again4096.log $R/widths.log | grep -v twin | cut -c1-150 \
  | tee -a $OUT/log.txt
log done; snap
