#!/usr/bin/env bash
# Session 48, call 10 (carry [".whl"]): the final code's GPU tests: the slabs (the plan's rows by the GPU, the looped
# threshold, the word kernel), the early pairx down, PDL's rule and bits, the engine's Q4_K / MXFP4 cases.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_slab_gemm.py \
  tests/engine/test_moe_pairx_down.py tests/engine/test_pdl.py tests/engine/test_kernel_engine.py \
  -k "not test_kernel_engine or Q4_K or MXFP4" > $R/t_final.txt 2>&1
log "tests rc $? $(tail -n 1 $R/t_final.txt)"; grep -E "^(FAILED|ERROR)|^E " $R/t_final.txt | head -20 >> $OUT/log.txt
snap
