#!/usr/bin/env bash
# Session 14 (moe24f, H200, carry [".whl", ".xfer/moe24f"]): the MoE decode layer in one launch (then
# sparkd/engine/kernels/moe_fused.py behind moe_decode(fused=...); after these numbers bench/moe_fused.py, bench-only)
# against the two launches, side by side in one process. Meanwhile (CPU-bound) the MoE GPU tests run in 3 groups
# and the bench compiles every tile (--compile-only); then the bench times, at 2048x768 / 4096x1536 / 7168x2048
# top-8, Q8_0, Q4_K (GGUF) and Q4_KXD (the resident pairx gate/up and down): the default layer (whole, "all qx",
# each launch, load-only twins, same-bytes copies), each --fused tile ("fused qx"; nf: no fold), the default again.
# Results: $OUT/res.tgz + $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
E=tests/engine
G=("$E/test_moe_fused.py $E/test_moe_reference.py $E/test_moe_words_full.py $E/test_moe_twin.py"
   "$E/test_moe_decode_fusion.py $E/test_moe_tiles.py"
   "$E/test_moe_tiled.py $E/test_moe_down_full.py $E/test_cuda_graphs.py -k moe")
P=()
for i in "${!G[@]}"; do
  timeout 125 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE ${G[$i]} > $R/gpu_tests_$((i+1)).log 2>&1 & P+=($!)
done
Q8="c64g16d32w4u2,c64g32d64w4u1,c64g64d64w8u1,c128g16d32w4u2,c128g32d64w8u1,c256g16d32w8u1,c256g32d64w8u1,c64g16d32w4u2nf"
Q4="c256g8d16w4u1,c256g16d32w8u1,c256g32d32w8u1,c512g16d32w8u1,c256g16d32w8u1nf"
FUSED="$(echo $Q8 | sed 's/\([^,]*\)/Q8_0@\1/g'),$(echo $Q4 | sed 's/\([^,]*\)/Q4_K@\1/g'),Q4_KXD@c256g4d4w1u1,Q4_KXD@c512g4d4w1u1"
ARGS="--defaults-only --sets new --types Q8_0,Q4_K,Q4_KXD --fused $FUSED"
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 95 python3 bench/moe_tiles_bench.py $ARGS --compile-workers 10 --compile-only \
  > $R/compile.log 2>&1
log "compile rc $? $(grep -c FAILED $R/compile.log) failed: $(grep -o 'fused [^ ]*: [A-Za-z]*' $R/compile.log | tr '\n' ' ')"
for i in "${!P[@]}"; do wait ${P[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/gpu_tests_$((i+1)).log)"; done
grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | head -20 | tee -a $OUT/log.txt; snap
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 105 python3 bench/moe_tiles_bench.py $ARGS --json $R/moe.json > $R/moe.log 2>&1
log "moe rc $?"
grep "all qx\|fused\|same-bytes\|FAILED" $R/moe.log | cut -c1-150 | tee -a $OUT/log.txt
snap
