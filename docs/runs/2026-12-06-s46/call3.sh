#!/usr/bin/env bash
# Session 46, call 3 (carry [".whl"]): the defaults after call 2 (SPARKD_SLAB_GEMM=bf16 from 512 rows with slabs of
# 128-row multiples; MLA's expansion in float16 under SPARKD_SDPA_PRECISION=half): the GPU tests they touch; the
# aligned slabs against the integer GEMM at 512 rows; the 5-layer DeepSeek-V3-shaped Q4_K model's prompt at 512 /
# 2000 / 8000 tokens, the defaults first (their first forward in a fresh process) against session 45's
# (mha:off:float32); a 12-layer Qwen3-30B-A3B-shaped Q4_K model's (GQA) at 512 / 2000 with and without the slabs.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
M=/var/tmp/deepseek-v3-5l-16e-Q4_K.gguf; Q=/var/tmp/qwen3-30b-a3b-12l-Q4_K.gguf
(nice -n 10 python3 -m sparkd.engine.cli make-model $M --preset deepseek-v3 --experts 16 --layers 5 --quant Q4_K --quiet
 nice -n 10 python3 -m sparkd.engine.cli make-model $Q --preset qwen3-30b-a3b --layers 12 --quant Q4_K --quiet) \
  > $R/make.log 2>&1 & MK=$!
timeout 280 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_slab_gemm.py \
  tests/engine/test_mla_prompt.py tests/engine/test_kimi_k3.py tests/engine/test_kv_f16.py \
  tests/engine/test_prompt_cache.py tests/engine/test_cuda_graphs.py tests/engine/test_prompt_chunks.py \
  tests/engine/test_eager_decode.py tests/engine/streaming/test_graph_step.py tests/engine/test_kernel_engine.py \
  > $R/t_gpu.txt 2>&1
log "tests rc $? $(tail -n 1 $R/t_gpu.txt)"; grep -E "^(FAILED|ERROR)" $R/t_gpu.txt | head -30 >> $OUT/log.txt; snap
(cd bench && timeout 120 python3 igemm_bench.py --types Q4T,Q8_0,Q6T --grouped '' --tokens 512 \
  --shapes 36864x7168,7168x18432,24576x1536,576x7168 --ways s13,slab-bf16 --repeats 10 --json $R/igemm.json) \
  > $R/igemm.txt 2>&1
log "igemm rc $?"; grep -v Warn $R/igemm.txt >> $OUT/log.txt; snap
wait $MK; log "made $(ls -la $M $Q | awk '{print $5}' | tr '\n' ' ')"
for n in 8000 2000 512; do
  timeout 150 python3 bench/gpu_box/prompt_profile.py $M --tokens $n --top 10 --ways mha,mha:off:float32,mha:off,mha \
    --json $R/v3_$n.json > $R/v3_$n.txt 2>&1
  log "v3 $n rc $?"; grep -v Warn $R/v3_$n.txt | grep -v "^  " >> $OUT/log.txt
done
snap
for n in 2000 512; do
  timeout 150 python3 bench/gpu_box/prompt_profile.py $Q --tokens $n --top 10 --ways mha,mha:off,mha \
    --json $R/q3_$n.json > $R/q3_$n.txt 2>&1
  log "qwen3 $n rc $?"; grep -v Warn $R/q3_$n.txt | grep -v "^  " >> $OUT/log.txt
done
snap
