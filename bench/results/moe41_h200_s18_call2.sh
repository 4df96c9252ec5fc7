#!/usr/bin/env bash
# Ran on bc0e226; Kernels.persist, --persist and Q8_0P were taken out after the calls (run it from bc0e226).
# Session 18, moe41, second call (H200, carry [".whl", ".xfer/moe41"], run from .xfer/moe41): the first call's twin
# said a persistent grid with 128-bit loads (vecp16) takes the gate/up twin 33.9 -> 29.6 us at 4096x1536; here the
# real gate/up on a persistent grid (moe_tiles.Kernels.persist: N tiles a program), GGUF words (Q8_0), permuted
# words (Q8_0P: 128-bit loads) and resident Q4_K (Q4_KXD), then Q8_0 at 2048 / 7168, then the bits test.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res2; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res2.tgz -C /tmp res2 2>/dev/null; }
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --defaults-only --sets new --no-twins"
timeout 50 $B --shapes 4096x1536x8 --types Q8_0,Q8_0P,Q4_KXD --variants again --persist 2,3,4 \
  --json $R/persist.json > $R/persist.log 2>&1
log "4096 persist bench rc $?"; snap
timeout 30 $B --shapes 2048x768x8,7168x2048x8 --types Q8_0 --persist 2,3 --json $R/widths.json > $R/widths.log 2>&1
log "widths bench rc $?"; snap
timeout 35 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_moe_perm.py > $R/tests.log 2>&1
log "tests rc $?: $(tail -1 $R/tests.log)"
log done; snap
