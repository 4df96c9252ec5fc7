#!/usr/bin/env bash
# Session 21, down49 (H200, carry [".whl", ".xfer/down49"], run from .xfer/down49): the MoE down at the widths
# moe48's pair fold left unmeasured, and the pairx down.
#   1. Q8_0 2048x768 (moe46's words ahead on 2/1/3/e/2, fold_part) and 7168x2048 (the grid down on 2/1/2/e/2):
#      the default against matmul.fold_pair (fold2; afold2 with the words ahead), interleaved twice ("all qx").
#   2. Q4_KXD 4096x1536 (pairx down 4/1/2/e/4, fold_part of 4 ranges): 2 ranges with the pair fold (again@4/1/2/e/2:
#      the pair fold is on at 4096 by width), q4_k_pair.down_sums (the next step's words ahead: pahead), both, and
#      2 ranges with fold_part (tickets@); the candidates as --down tiles too (the down alone).
#   3. Q4_KXD 2048x768 (4/1/3/e/4): the same at 2 ranges of 4/1/3/e/2 (fold2@, pafold2@: the pair fold asked for).
#   4. the GPU bits tests (test_moe_down_ahead.py, test_moe_pairx_down.py).
#   5. second processes: each group's fastest candidate against the default, interleaved (W,again,W).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --sets new --no-twins"
P4096="again,again@4/1/2/e/2,pahead,pahead@4/1/2/e/2,tickets@4/1/2/e/2,again,again@4/1/2/e/2,pahead,pahead@4/1/2/e/2"
P2048="again,fold2@4/1/3/e/2,pahead,pafold2@4/1/3/e/2,again,fold2@4/1/3/e/2,pahead,pafold2@4/1/3/e/2"
timeout 60 $B --types Q4_KXD --gate-up "" --compile-workers 8 --shapes 4096x1536x8 --variants $P4096 \
  --down 4/1/2/e/2:wpvVfdno,4/1/2/e/4:wpvVfdnA,4/1/2/e/2:wpvVfdnoA --json $R/px4096.json > $R/px4096.log 2>&1
log "pairx 4096 rc $?"; snap
timeout 50 $B --types Q8_0 --defaults-only --compile-workers 8 --shapes 2048x768x8,7168x2048x8 \
  --variants again,fold2,afold2,again,fold2,afold2 --json $R/q8.json > $R/q8.log 2>&1
log "Q8_0 2048/7168 rc $?"; snap
timeout 50 $B --types Q4_KXD --gate-up "" --compile-workers 8 --shapes 2048x768x8 --variants $P2048 \
  --down 4/1/3/e/2:wpvVfdno,4/1/3/e/4:wpvVfdnA,4/1/3/e/2:wpvVfdnoA --json $R/px2048.json > $R/px2048.log 2>&1
log "pairx 2048 rc $?"; snap
timeout 70 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_moe_down_ahead.py \
  tests/engine/test_moe_pairx_down.py > $R/tests.log 2>&1
log "tests rc $?: $(tail -1 $R/tests.log)"
grep -h "^FAILED\|^ERROR\|Error" $R/tests.log | head -20 | tee -a $OUT/log.txt; snap
best() {  # the fastest mean "all qx" row of json $1 at shape $2 among the variants $3
python3 - "$@" <<'PY'
import json, statistics, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception:
    rows = []
us = {}
for r in rows:
    name = r["config"].split(" ", 1)[-1]
    if r["kernel"].endswith(" all qx") and sys.argv[2] in r["kernel"] and r["config"].startswith("default ") \
            and name in sys.argv[3].split(","):
        us.setdefault(name, []).append(r["us"])
print(min(us, key=lambda k: statistics.mean(us[k])) if us else "again")
PY
}
W4=$(best $R/px4096.json 4096x1536 again@4/1/2/e/2,pahead,pahead@4/1/2/e/2)
W2=$(best $R/px2048.json 2048x768 fold2@4/1/3/e/2,pahead,pafold2@4/1/3/e/2)
log "winners pairx 4096 $W4, 2048 $W2"
timeout 35 $B --types Q4_KXD --gate-up "" --defaults-only --shapes 4096x1536x8 --variants $W4,again,$W4 \
  --json $R/px4096b.json > $R/px4096b.log 2>&1
log "pairx 4096 second process rc $?"; snap
timeout 35 $B --types Q8_0 --defaults-only --shapes 2048x768x8,7168x2048x8 \
  --variants fold2,again,afold2,fold2,again,afold2 --json $R/q8b.json > $R/q8b.log 2>&1
log "Q8_0 second process rc $?"; snap
timeout 30 $B --types Q4_KXD --gate-up "" --defaults-only --shapes 2048x768x8 --variants $W2,again,$W2 \
  --json $R/px2048b.json > $R/px2048b.log 2>&1
log "pairx 2048 second process rc $?"; snap
grep -h "all qx\|top8 down\|copy\|FAILED" $R/px4096.log $R/q8.log $R/px2048.log $R/px4096b.log $R/q8b.log $R/px2048b.log \
  | cut -c1-140 | tee -a $OUT/log.txt
log done; snap
