#!/usr/bin/env bash
# Session 48, call 7 (carry [".whl"], the H200: issue 8's card): the GPU tests of the early pairx down and the word
# dequantization at the final code; the Q4_KXD top-8 decode layer at 4096x1536 and 7168x2048, the default (early)
# against "pahead" (the loads ahead, the wait first) interleaved, with the floor rows.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_moe_pairx_down.py \
  tests/engine/test_pdl.py tests/engine/test_moe_tiles.py tests/engine/test_slab_gemm.py -k "not prompt" \
  > $R/t_final.txt 2>&1
log "tests rc $? $(tail -n 1 $R/t_final.txt)"; grep -E "^(FAILED|ERROR)|^E " $R/t_final.txt | head -20 >> $OUT/log.txt
snap
timeout 200 env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --types Q4_KXD --sets new \
  --shapes 4096x1536x8,7168x2048x8 --defaults-only --no-twins --floor --variants pahead,again,pahead,again \
  --compile-workers 8 --json $R/moe.json > $R/moe.txt 2>&1
log "moe rc $?"; grep -v Warn $R/moe.txt | grep -E "all qx|copies|floor:|FAILED|Error|d2d" | cut -c1-180 >> $OUT/log.txt
snap
