#!/usr/bin/env bash
# Ran on commit 1e63d29 (the one-launch layer, taken out again in the next commit: --variants one,two and
# SPARKD_MOE_ONE_LAUNCH exist only there).
# Session 14, moe24 (H200, carry [".whl", ".xfer/moe24"], run from .xfer/moe24): the MoE decode layer in one launch.
#   1. bench/moe_tiles_bench.py at 2048x768 / 4096x1536 / 7168x2048 top-8, Q8_0, Q4_K and Q4_KXD (the resident
#      Q4_K: gate/up and down in pairx bytes), default tiles: the layer as the engine runs it ("all qx"), each
#      launch alone, the load-only twins, the same-bytes copies; --variants two,one,two,one: two launches against
#      one (moe_tiles.Kernels.one_launch) interleaved.
#   2. the MoE GPU tests with SPARKD_MOE_ONE_LAUNCH=on (every layer that fits runs as one launch) in parallel groups.
#   3. if the 12-layer Qwen3-30B-A3B-shaped Q4_K model (made in the background meanwhile) is ready: the resident
#      decode with SPARKD_MOE_ONE_LAUNCH=off / on, interleaved.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
M=$W/q3-12-Q4_K.gguf
( [ -f $M ] || nice -n 10 timeout 200 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K \
    --quiet --layers 12 && mv $M.part $M ) > $R/make.log 2>&1 &
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 100 python3 bench/moe_tiles_bench.py --defaults-only --sets new \
  --types Q8_0,Q4_K,Q4_KXD --variants two,one,two,one --compile-workers 8 --json $R/moe.json > $R/moe.log 2>&1
log "moe bench rc $?"; snap
E=tests/engine
G=("$E/test_moe_tiles.py"
   "$E/test_moe_tiled.py"
   "$E/test_moe_decode_fusion.py $E/test_moe_down_full.py"
   "$E/test_moe_words_full.py $E/test_moe_reference.py $E/test_moe_twin.py"
   "$E/test_kernels.py -k moe"
   "$E/test_cuda_graphs.py -k moe"
   "$E/test_pdl.py")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval SPARKD_MOE_ONE_LAUNCH=on timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done; snap
if [ -f $M ] && [ $(( $(date +%s) - T0 )) -lt 180 ]; then
  r=0; for way in off on off on; do r=$((r+1))
    [ $(( $(date +%s) - T0 )) -lt 200 ] || break
    SPARKD_MOE_ONE_LAUNCH=$way timeout 30 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 128 \
      --device cuda --resident --cuda-graphs on --json > $R/decode_${way}_$r.json 2> $R/decode_${way}_$r.err
    log "decode Q4_K one_launch=$way #$r rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/decode_${way}_$r.json)"
  done
else log "decode skipped: model $(ls -la $M 2>&1 | tail -c 80)"; fi
snap
