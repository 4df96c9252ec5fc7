#!/usr/bin/env bash
# Session 21, moe48 (H200, carry [".whl", ".xfer/moe48"], run from .xfer/moe48): the Q8_0 MoE down's loop with x's
# words loaded a step ahead too (moe_down_ahead XAHEAD; Kernels.down_x_ahead, not yet a default), so a step's dots
# wait on no load of their own iteration (offline sm_90: 2/1/3/e/2 with the words ahead only had 4 of the next
# step's loads on the scoreboard of this step's x loads, and a dot waited on it mid-step).
#   1. moe_tiles_bench at 4096x1536 top-8 Q8_0: the engine's layer ("default"), then variants interleaved: again,
#      x ahead at 2/1/3/e/2 and 2/1/2/e/2, moe46's words ahead at both, twice over; --floor; the down tiles alone
#      (flag a: words ahead, ax: x ahead too; 2/1/3/e/4: four ranges), each alone, as the layer and as "all qx".
#   2. a second process: the fastest x-ahead "all qx" of 1 against the default, interleaved: default, cand, x2.
#   3. 2048x768 (default: moe46's 2/1/3/e/2 words ahead) and 7168x2048 (default: the grid down on 2/1/2/e/2): the
#      default against x ahead at the width's whole-step tile, interleaved.
#   4. the GPU test of the down's bits (words ahead and x ahead at 4096 / 7168 / 2048, 1 and 2 warps).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --sets new --types Q8_0 --no-twins"
X3=xahead@2/1/3/e/2; X2=xahead@2/1/2/e/2; A3=ahead@2/1/3/e/2
V=again,$X3,$A3,$X2,ahead,again,$X3,$A3,$X2,ahead
CANDS=2/1/3/e/2:wpvVfax,2/1/3/e/2:wpvVfa,2/1/2/e/2:wpvVfax,2/1/3/e/4:wpvVfax
timeout 60 $B --compile-workers 8 --shapes 4096x1536x8 --variants $V --floor --gate-up "" --down $CANDS \
  --json $R/moe4096.json > $R/moe4096.log 2>&1
log "4096 bench rc $?"; snap
W=$(python3 - <<'PY'
import json, statistics
try:
    rows = json.load(open("/tmp/res/moe4096.json"))["rows"]
except Exception:
    rows = []
us = {}
for r in rows:  # the x-ahead rows: variants "default xahead@T", tile rows "T:wpvVfax" (T's split 2)
    c = r["config"]
    if r["kernel"].endswith(" all qx") and ("xahead@" in c or c.endswith("/2:wpvVfax")):
        t = c.split("@")[-1] if "@" in c else c.split(":")[0]
        us.setdefault("xahead@" + t, []).append(r["us"])
print(min(us, key=lambda k: statistics.mean(us[k])) if us else "xahead@2/1/3/e/2")
PY
)
log "winner $W"
timeout 30 $B --defaults-only --shapes 4096x1536x8 --variants $W,again,$W --json $R/again4096.json \
  > $R/again4096.log 2>&1
log "4096 second process rc $?"; snap
timeout 35 $B --defaults-only --compile-workers 8 --shapes 2048x768x8 --variants $X3,again,$X3 \
  --json $R/w2048.json > $R/w2048.log 2>&1
log "2048 rc $?"; snap
timeout 35 $B --defaults-only --compile-workers 8 --shapes 7168x2048x8 --variants xahead,again,xahead,ahead \
  --json $R/w7168.json > $R/w7168.log 2>&1
log "7168 rc $?"; snap
timeout 50 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_moe_down_ahead.py > $R/tests.log 2>&1
log "tests rc $?: $(tail -1 $R/tests.log)"
grep -h "^FAILED\|^ERROR" $R/tests.log | head -20 | tee -a $OUT/log.txt; snap
grep -h "all qx\|down \|floor\|copy" $R/moe4096.log $R/again4096.log $R/w2048.log $R/w7168.log | grep -v twin \
  | cut -c1-150 | tee -a $OUT/log.txt
log done; snap
