#!/usr/bin/env bash
# Session 21, q4k48 (H200, carry [".whl", ".xfer/q4k48"], run from .xfer/q4k48): the pairx MoE gate/up with a constant
# trip count (q4_k_pair.gate_up; bench flags n: the tile's unroll a step, N: a group's loads before the previous
# group's dots) against the idot loop (:wpvVfd, the default's kernels spelled out: the control).
#   1. the GPU tests touched (the new bits tests at 2048 and 4096, test_moe_tiled, the pairx GEMV's).
#   2. bench/moe_tiles_bench.py, Q4_KXD at 4096x1536 and 2048x768 top-8 (Q4_KX at 2048 too), gate/up candidates
#      alone and as the "all qx" layer, `again` for the drift; a second process with the candidates in reverse order.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
E=tests/engine
G=("$E/test_moe_pairx_steps.py $E/test_moe_tiled.py" "$E/test_q4_k_tiled.py -k pairx")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt; snap
C=4/1/1/e:wpvVfd,4/1/1/e:wpvVfdn,4/1/2/e:wpvVfdn,4/1/4/e:wpvVfdn,4/1/8/e:wpvVfdn,4/1/1/e:wpvVfdN
CR=4/1/1/e:wpvVfdN,4/1/8/e:wpvVfdn,4/1/4/e:wpvVfdn,4/1/2/e:wpvVfdn,4/1/1/e:wpvVfdn,4/1/1/e:wpvVfd
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 80 python3 bench/moe_tiles_bench.py --sets new --types Q4_KXD \
  --shapes 4096x1536x8,2048x768x8 --variants again --gate-up $C --down "" --compile-workers 12 --json $R/moe1.json \
  > $R/moe1.log 2>&1
log "bench 1 rc $?"; snap
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 50 python3 bench/moe_tiles_bench.py --sets new --types Q4_KXD,Q4_KX \
  --shapes 4096x1536x8,2048x768x8 --variants again --gate-up "Q4_KXD@${CR//,/,Q4_KXD@},Q4_KX@4/1/1/e:wpvVfd,Q4_KX@4/1/8/e:wpvVfdn,Q4_KX@4/1/1/e:wpvVfdN" \
  --down "" --no-twins --compile-workers 12 --json $R/moe2.json > $R/moe2.log 2>&1
log "bench 2 rc $?"; snap
grep -h "gate/up \|all qx\|d2d" $R/moe1.log $R/moe2.log | cut -c1-150 >> $OUT/log.txt
log done; snap
