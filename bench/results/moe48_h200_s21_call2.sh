#!/usr/bin/env bash
# Session 21, moe48, call 2 (H200, carry [".whl", ".xfer/moe48"], run from .xfer/moe48): the Q8_0 MoE down's two
# expert ranges folded by matmul.fold_pair (one atomic exchange of the sums; Kernels.down_pair_fold, not yet a
# default) instead of fold_part (store, fence, ticket, read-back), at the engine's 4096 tile with and without moe46's
# words ahead (call 1: x ahead lost or tied; the down's fold is ~1.5 us of its 19.5: moe39's twin 16.7, +fold 18.2).
#   1. 4096x1536 top-8 Q8_0 "all qx": default, fold2, afold2, ahead, twice over, interleaved.
#   2. a second process: the faster of fold2 / afold2 against the default, interleaved: default, cand, again, cand.
#   3. the GPU test of the down's bits (x ahead and the pair fold too, 4096 / 7168 / 2048).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res2; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res2.tgz -C /tmp res2 2>/dev/null; }
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --sets new --types Q8_0 --no-twins"
timeout 30 $B --defaults-only --compile-workers 8 --shapes 4096x1536x8 \
  --variants again,fold2,afold2,ahead,again,fold2,afold2,ahead --json $R/fold4096.json > $R/fold4096.log 2>&1
log "4096 bench rc $?"; snap
W=$(python3 - <<'PY'
import json, statistics
try:
    rows = json.load(open("/tmp/res2/fold4096.json"))["rows"]
except Exception:
    rows = []
us = {}
for r in rows:
    if r["kernel"].endswith(" all qx") and r["config"] in ("default fold2", "default afold2"):
        us.setdefault(r["config"].split()[1], []).append(r["us"])
print(min(us, key=lambda k: statistics.mean(us[k])) if us else "afold2")
PY
)
log "winner $W"
timeout 20 $B --defaults-only --shapes 4096x1536x8 --variants $W,again,$W --json $R/again4096.json \
  > $R/again4096.log 2>&1
log "4096 second process rc $?"; snap
timeout 35 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_moe_down_ahead.py > $R/tests.log 2>&1
log "tests rc $?: $(tail -1 $R/tests.log)"
grep -h "^FAILED\|^ERROR\|Error" $R/tests.log | head -20 | tee -a $OUT/log.txt; snap
grep -h "all qx\|down \|copy" $R/fold4096.log $R/again4096.log | cut -c1-150 | tee -a $OUT/log.txt
log done; snap
