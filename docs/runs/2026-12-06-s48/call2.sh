#!/usr/bin/env bash
# Session 48, call 2 (carry [".whl"]): dequantize's word kernel (pairx Q4_K, tiled MXFP4) against the tile kernel
# with and without session 47's rounding by hand: the GPU tests, the kernels alone (deq_probe.py), one MoE layer's
# slabs (moe_slab_bench.py, slab against slab~tile and the integer GEMMs).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
S=docs/runs/2026-12-06-s48
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_slab_gemm.py \
  tests/engine/test_kernels.py -k "slab or dequantize or word_kernel or dense" > $R/t_deq.txt 2>&1
log "tests rc $? $(tail -n 1 $R/t_deq.txt)"; grep -E "^(FAILED|ERROR)|^E " $R/t_deq.txt | head -20 >> $OUT/log.txt
snap
timeout 120 python3 $S/deq_probe.py --ways words,words@32/4,words@16/8,words@64/8,words@8/2,tile,tile-round \
  > $R/deq.txt 2>&1
log "deq rc $?"; grep -v Warn $R/deq.txt >> $OUT/log.txt
snap
timeout 200 python3 bench/moe_slab_bench.py --models qwen3,gpt-oss,deepseek-v3 --tokens 256,512,1000,2000 \
  --ways int8,slab,slab~tile,slab --json $R/moe_slab.json > $R/moe_slab.txt 2>&1
log "moe_slab rc $?"; grep -v Warn $R/moe_slab.txt >> $OUT/log.txt
snap
