#!/usr/bin/env bash
# Ran on the tree of 498f082. Q8_0P (moe.perm_experts, kernels/q8_0_perm.py) was taken out after the calls: run it
# from bc0e226 to repeat them.
# Session 18, moe41 (H200, carry [".whl", ".xfer/moe41"], run from .xfer/moe41): the 4096x1536 top-8 MoE layer's
# gate/up load structure. Engine unchanged; the candidate is a layout the bench makes (Q8_0P: moe.perm_experts,
# q8_0_perm's word order, the words step's 128-bit loads, the same bits).
#   1. moe_tiles_bench.py --floor at 4096x1536 top-8: Q8_0 (GGUF words, the engine's), Q8_0P (permuted), Q4_KXD
#      (resident pairx, unchanged: the side by side), the layer twice each; the gate/up twin's load width and grid
#      (--twin-loads: 128-bit loads, persistent grids of 13 / 16 / 8 programs an SM).
#   2. Q8_0 against Q8_0P at 2048x768, 4096x1536 (again) and 7168x2048 top-8, no twins.
#   3. the MoE GPU tests (test_moe_perm.py's bits test at 4096 among them) in parallel groups.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --defaults-only --sets new --compile-workers 8"
timeout 110 $B --floor --shapes 4096x1536x8 --types Q8_0,Q8_0P,Q4_KXD --variants again \
  --twin-loads vec,p13,vecp16,vecp8 --json $R/floor.json > $R/floor.log 2>&1
log "4096 bench rc $?"; snap
timeout 60 $B --no-twins --shapes 2048x768x8,4096x1536x8,7168x2048x8 --types Q8_0,Q8_0P --variants again \
  --json $R/widths.json > $R/widths.log 2>&1
log "widths bench rc $?"; snap
E=tests/engine
G=("$E/test_moe_perm.py $E/test_moe_words_full.py"
   "$E/test_moe_tiles.py $E/test_moe_tiled.py"
   "$E/test_kernels.py -k moe"
   "$E/test_moe_decode_fusion.py $E/test_moe_reference.py")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 55 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt
log done; snap
