#!/usr/bin/env bash
# Session 21, pipe48 (H200, carry [".whl", ".xfer/pipe48"], run from .xfer/pipe48): moe_pipe's Q8_0 gate/up at
# 4096x1536 top-8 under ptxas's register cap (Kernels.pipe_regs: 128 and 112, still 16 programs an SM) and on gate and
# up in q8_0_perm's word order (Kernels.pipe_perm: the words step's weights as 128-bit loads), the same h and y bits.
#   1. moe_tiles_bench.py: the engine's layer (and again), then the pipe 16 (the default) and the candidates, twice,
#      interleaved ($ITEMS: the --pipe items, PER[rREGS][p]).
#   2. the best candidate of step 1 (the layer "all qx", mean of its two rows) against the default in a process of
#      its own (16, W, 16, W).
#   3. GPU tests: test_moe_pipe.py (the candidates' bits at 4096, the default and perm at 2048 / 7168), test_moe_tiles.py.
# Ran on aa18827; the candidates are out of HEAD (no win on the layer: docs/performance.md, session 21, pipe48).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee -a $OUT/log.txt
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --defaults-only --sets new --types Q8_0 --no-twins"
timeout 75 $B --compile-workers 8 --shapes 4096x1536x8 --variants again \
  --pipe ${ITEMS:-16,16r128,16r112,16p,16r128p,16r112p,16,16r128,16r112,16p,16r128p,16r112p} \
  --json $R/cands.json > $R/cands.log 2>&1
log "candidates bench rc $?"; snap
W=$(python3 - <<'PY'
import json, statistics
rows = json.load(open("/tmp/res/cands.json"))["rows"]
lay = {}
for r in rows:
    if r["kernel"].endswith(" all qx") and r["config"].startswith("default pipe 16") and r["config"] != "default pipe 16":
        lay.setdefault(r["config"].split()[-1], []).append(r["us"])
print(min(lay, key=lambda f: statistics.mean(lay[f])) if lay else "16r128")
PY
)
log "best candidate $W"
timeout 40 $B --shapes 4096x1536x8 --pipe 16,$W,16,$W --json $R/again.json > $R/again.log 2>&1
log "again bench rc $?"; snap
E=tests/engine
G=("$E/test_moe_pipe.py" "$E/test_moe_tiles.py")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt
log done; snap
