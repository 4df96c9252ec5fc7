#!/usr/bin/env bash
# Session 12, q4k20, second call (H200, carry [".whl", ".xfer/q4k20"], run from .xfer/q4k20): the first call's
# warps_k launch ran at ptxas's own 40 registers, where a step's header loads follow its dp4a; the same rows with
# the launch at maxnreg 64 (matmul.KSTEP_MAXNREG) and the kstep GPU tests again. Results: $OUT/res2.tgz.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res2; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res2.tgz -C /tmp res2 2>/dev/null; }
P=pairx:4/1/2
ROWS="Q4T@$P/e,Q4T@$P/en,Q4T@$P/ew/2,Q4T@$P/ew/4,Q4T@$P/ew/8"
B="python3 bench/gemv_tiles_bench.py --types Q4T --qx --no-act-quant --shapes 4096x14336,6144x4096,4096x2048,5120x2048"
SPARKD_PDL=off timeout 40 $B --defaults-only --rows "$ROWS" --compile-only --compile-workers 12 > $R/compile.log 2>&1 & C=$!
timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_gemv_split.py -k "warps_k or default_split" \
  > $R/tests.log 2>&1; log "tests rc $? $(tail -1 $R/tests.log)"
wait $C; log "compile rc $? $(tail -1 $R/compile.log)"
SPARKD_PDL=off timeout 30 $B --defaults-only --rows "$ROWS" --json $R/gemv.json > $R/gemv.log 2>&1
log "gemv rc $?"; snap
