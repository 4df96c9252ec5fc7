#!/usr/bin/env bash
# Session 36, call A (the machine was lent at the session's end; call1.sh's parts that fit, no llama.cpp build):
# the GPU tests no machine had run, then kernels_bench's F16 / BF16 GEMV beside torch.mv (cuBLAS). carry [".whl", ".cache"].
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res2; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res2; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee -a $OUT/log.txt
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_fallback_types.py \
  tests/engine/test_q4_0_int.py tests/engine/test_kernels.py tests/engine/test_kernel_engine.py \
  tests/engine/test_kv_f16.py tests/engine/test_deepseek4_fused.py tests/engine/streaming/test_graph_step.py \
  -k "IQ4_NL or iq4_nl or Q5_1 or q4_0 or Q4_0 or embedding or dequantize or mla_head or token_embedding or F16 or \
half or 16_bit or deepseek4 or kimi or f16" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
snap
timeout 170 python3 bench/kernels_bench.py --types F16,BF16,Q8_0 --shapes dense0,dense1 --unified off \
  --json $R/kernels.json > $R/kernels.txt 2>&1
log "kernels_bench rc $?"
cat $R/kernels.txt | tee -a $OUT/log.txt
snap
