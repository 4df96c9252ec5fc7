#!/usr/bin/env bash
# Session 20, moe47 (H200, carry [".whl", ".xfer/moe47"], run from .xfer/moe47): leaner forms of moe_pipe's
# software-pipelined persistent Q8_0 gate/up at 4096x1536 top-8 (moe_tiles.Kernels.pipe_form, the same h and y bits):
# FORM 1 the tile's steps unrolled inside a loop over tiles (the tile's end outside the steps' code), 2 the h block
# tickets (fence, atomic round trip) after the program's last tile instead of in the loop, 3 both; 0 moe42's.
#   1. moe_tiles_bench.py: the engine's layer (and again), then the pipe's forms 0-3 at 16 an SM, twice, interleaved
#      ($FORMS: the --pipe items; the second call: FORMS=16,16f2,16,16f2).
#   2. the best form of step 1 against form 0 in a process of its own (0, W, 0, W).
#   3. GPU tests: test_moe_pipe.py (the forms' bits at 2048 / 4096 / 7168), the fused and reference MoE tests.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --defaults-only --sets new --types Q8_0 --no-twins"
timeout 110 $B --compile-workers 8 --shapes 4096x1536x8 --variants again --pipe ${FORMS:-16,16f1,16f2,16f3,16,16f1,16f2,16f3} \
  --json $R/forms.json > $R/forms.log 2>&1
log "forms bench rc $?"; snap
W=$(python3 - <<'PY'
import json, statistics
rows = json.load(open("/tmp/res/forms.json"))["rows"]
lay = {}
for r in rows:
    if r["kernel"].endswith(" all qx") and r["config"].startswith("default pipe 16f"):
        lay.setdefault(r["config"].split("16f")[1], []).append(r["us"])
print(min(lay, key=lambda f: statistics.mean(lay[f])) if lay else 2)
PY
)
log "best form $W"
timeout 50 $B --shapes 4096x1536x8 --pipe 16,16f$W,16,16f$W --json $R/again.json > $R/again.log 2>&1
log "again bench rc $?"; snap
E=tests/engine
G=("$E/test_moe_pipe.py" "$E/test_moe_decode_fusion.py $E/test_moe_reference.py" "$E/test_moe_tiles.py")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt
log done; snap
