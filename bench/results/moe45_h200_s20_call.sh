#!/usr/bin/env bash
# Ran on commit ef502c7 (moe_one with its first spin, ld.acquire polling; the bench's --one rows).
# Session 20, moe45 (H200, carry [".whl", ".xfer/moe45"], run from .xfer/moe45): the Q8_0 MoE decode layer in one
# persistent launch (kernels/moe_one.py, Kernels.one; not yet a default) against the engine's two launches.
#   1. bench/moe_tiles_bench.py at 2048x768 / 4096x1536 / 7168x2048 top-8 Q8_0: the default layer "all qx" (and
#      again), --floor, the two launches with the down tile 4/1/1/e/8 (2048's one-launch down: its default down
#      4/1/1/g/8 is the grouped step), the one-launch rows (--one: at most 32 an SM, i.e. all resident, twice; 16 an
#      SM; 32 with the 4/1/1/e/8 down).
#   2. the GPU tests: test_moe_one (the bits at the three widths), test_moe_pipe + test_moe_words_full
#      (q8_0_words.dot_words' FMA argument), test_pdl's, in parallel groups.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
log "triton $(python3 -c 'import triton; print(triton.__version__)') torch $(python3 -c 'import torch; print(torch.__version__)')"
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 150 python3 bench/moe_tiles_bench.py --sets new --types Q8_0 --no-twins \
  --gate-up "" --down 4/1/1/e/8 --compile-workers 8 --shapes 2048x768x8,4096x1536x8,7168x2048x8 --variants again \
  --floor --one 32,16,32@4/1/1/e/8,32 --json $R/moe.json > $R/moe.log 2>&1
log "bench rc $?"; grep -h "all qx\|FAILED\|floor:" $R/moe.log | tee -a $OUT/log.txt; snap
E=tests/engine
G=("$E/test_moe_one.py"
   "$E/test_moe_pipe.py $E/test_moe_words_full.py"
   "$E/test_pdl.py")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR\|Error" $R/tests_*.log | head -20 | tee -a $OUT/log.txt
log done; snap
