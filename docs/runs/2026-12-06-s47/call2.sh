#!/usr/bin/env bash
# Session 47, call 2 (carry [".whl"]): the slab experts without a host sync where the table fits EXPERT_SLAB_BYTES
# (2 GiB; ranges with one sync beyond), counted in the plan: the GPU tests; moe_slab_bench.py with dequantize's launch
# swept (BLOCK_N / WARPS) and 256 MiB ranges; the Qwen3-shaped, gpt-oss-20b and DeepSeek-V3-shaped prompts at
# SLAB_EXPERT_ROWS 32, 64 and off.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
M=/var/tmp/deepseek-v3-5l-16e-Q4_K.gguf; Q=/var/tmp/qwen3-30b-a3b-12l-Q4_K.gguf; G=/var/tmp/gpt-oss-20b-4l-F16.gguf
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part "${@:2}" --quiet && mv $1.part $1; }; }
(mk $Q --preset qwen3-30b-a3b --layers 12 --quant Q4_K
 mk $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4
 mk $M --preset deepseek-v3 --experts 16 --layers 5 --quant Q4_K) > $R/make.log 2>&1 &
have() { while [ ! -f $1 ] && [ $(( $(date +%s) - T0 )) -lt 400 ]; do sleep 2; done; }
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_slab_gemm.py \
  tests/engine/test_attention_memory.py tests/engine/test_kernels.py -k "slab or workspace or dequantize" \
  > $R/t_slab.txt 2>&1
log "tests rc $? $(tail -n 1 $R/t_slab.txt)"; grep -E "^(FAILED|ERROR)|Error" $R/t_slab.txt | head -20 >> $OUT/log.txt
snap
timeout 170 env PYTHONPATH=$PYTHONPATH:bench python3 bench/moe_slab_bench.py --models qwen3,gpt-oss,deepseek-v3 \
  --tokens 256,512,1000,2000,8000 --ways int8,slab,slab@32/4,slab@64/4,slab@32/8,slab@64/8,slab-256 \
  --json $R/moe_slab.json > $R/moe_slab.txt 2>&1
log "moe_slab rc $?"; grep -v Warn $R/moe_slab.txt >> $OUT/log.txt
snap
have $Q
for n in 2000 512; do
  timeout 50 python3 bench/gpu_box/prompt_profile.py $Q --tokens $n --top 8 \
    --ways mha,mha:::32,mha:::64,mha --json $R/q3_$n.json > $R/q3_$n.txt 2>&1
  log "qwen3 $n rc $?"; grep -v Warn $R/q3_$n.txt | grep -v "^  " >> $OUT/log.txt
done
snap
have $G
for n in 2000 512; do
  timeout 50 python3 bench/gpu_box/prompt_profile.py $G --tokens $n --top 8 \
    --ways mha,mha:::32,mha:::64,mha --json $R/gptoss_$n.json > $R/gptoss_$n.txt 2>&1
  log "gpt-oss $n rc $?"; grep -v Warn $R/gptoss_$n.txt | grep -v "^  " >> $OUT/log.txt
done
snap
have $M
for n in 8000 2000 512; do
  timeout 50 python3 bench/gpu_box/prompt_profile.py $M --tokens $n --top 8 \
    --ways mha,mha:::32,mha:::1000000000,mha --json $R/v3_$n.json > $R/v3_$n.txt 2>&1
  log "v3 $n rc $?"; grep -v Warn $R/v3_$n.txt | grep -v "^  " >> $OUT/log.txt
done
snap
