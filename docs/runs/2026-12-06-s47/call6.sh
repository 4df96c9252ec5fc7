#!/usr/bin/env bash
# Session 47, call 6 (carry [".whl"]; old_kernels/, untracked, holds q4_k.py, q4_k_pair.py and mxfp4_tiled.py as they
# were before): the Q4_K (GGUF and pairx) and MXFP4 tiled dequants as word loads (the slabs' dequantization). The GPU
# tests of the kernels they touch; then the old and the new dequants side by side on this box: moe_slab_bench.py and
# igemm_bench.py's slab-bf16 way at DeepSeek V3's dense shapes, each run once on a copy of the tree with the old files.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; OLD=/tmp/old; rm -rf $OLD; mkdir -p $OLD; cp -r sparkd bench $OLD/
cp old_kernels/*.py $OLD/sparkd/engine/kernels/
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
PYTHONPATH=/tmp/site:$NEW timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_slab_gemm.py \
  tests/engine/test_nibble_tiles.py tests/engine/test_q4_k_tiled.py tests/engine/test_q4t_pair.py \
  tests/engine/test_kernel_engine.py tests/engine/test_kernels.py \
  -k "not test_kernels or pairx or q4_k or Q4_K or mxfp4 or MXFP4 or dequant or embedding" > $R/tests.txt 2>&1
log "tests rc $? $(tail -n 1 $R/tests.txt)"; grep -E "^(FAILED|ERROR)" $R/tests.txt | head -20 >> $OUT/log.txt
snap
for side in old new; do
  [ $side = old ] && T=$OLD || T=$NEW
  (cd $T && PYTHONPATH=/tmp/site:$T:$T/bench timeout 60 python3 bench/moe_slab_bench.py --models qwen3,gpt-oss,deepseek-v3 \
    --tokens 512,2000 --ways int8,slab --json $R/moe_slab_$side.json) > $R/moe_slab_$side.txt 2>&1
  log "moe_slab $side rc $?"; grep -v Warn $R/moe_slab_$side.txt | sed "s/^/$side /" >> $OUT/log.txt
  (cd $T/bench && PYTHONPATH=/tmp/site:$T timeout 40 python3 igemm_bench.py --types Q4T --grouped '' \
    --shapes 18432x7168,7168x18432 --ways s13,slab-bf16 --tokens 512,2048 --repeats 10 \
    --json $R/igemm_$side.json) > $R/igemm_$side.txt 2>&1
  log "igemm $side rc $?"; grep -v Warn $R/igemm_$side.txt | sed "s/^/$side /" >> $OUT/log.txt
  snap
done
