#!/usr/bin/env bash
# Session 19, moe42 (H200, carry [".whl", ".xfer/B"], run from .xfer/B): the Q8_0 MoE gate/up as moe_pipe's
# software-pipelined persistent kernel (moe_tiles.Kernels.pipe: N programs an SM, the next loop step's weight words
# in flight during this step's dots), against the engine's grid kernel in the same process.
#   1. moe_tiles_bench.py at 4096x1536 top-8 Q8_0: the engine's layer (and again), --floor, the gate/up twins (base,
#      vecp16 = moe41's 0.94, vecp16f / p16f = the same with the next step's words loaded ahead), and the layer and
#      gate/up with the pipe at 16 / 12 / 21 / 8 programs an SM (2/1/4/e, 96 registers offline: 21 resident) and at
#      the 2/1/2/e tile (66 registers) 16 / 24 / 31.
#   2. 2048x768 and 7168x2048 top-8 Q8_0: the engine's layer against the pipe at 16 / 12 programs an SM.
#   3. step 1's layer rows again in a process of their own (the noise of two runs).
#   4. the MoE GPU tests (test_moe_pipe.py's bits test at the three widths among them) in parallel groups.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --defaults-only --sets new --types Q8_0"
PIPES=16,12,21,8,16@2/1/2/e,24@2/1/2/e,31@2/1/2/e
timeout 85 $B --compile-workers 8 --floor --shapes 4096x1536x8 --variants again --twin-loads base,vecp16,vecp16f,p16f \
  --pipe $PIPES --json $R/pipe.json > $R/pipe.log 2>&1
log "4096 bench rc $?"; snap
timeout 45 $B --no-twins --shapes 2048x768x8,7168x2048x8 --variants again --pipe 16,12 --json $R/widths.json \
  > $R/widths.log 2>&1
log "widths bench rc $?"; snap
timeout 40 $B --no-twins --shapes 4096x1536x8 --variants again --pipe $PIPES --json $R/again.json > $R/again.log 2>&1
log "4096 again rc $?"; snap
E=tests/engine
G=("$E/test_moe_pipe.py $E/test_moe_words_full.py $E/test_moe_twin.py"
   "$E/test_moe_tiles.py $E/test_moe_tiled.py"
   "$E/test_moe_decode_fusion.py $E/test_moe_reference.py $E/test_pdl.py")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 70 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt
log done; snap
