#!/usr/bin/env bash
# Session 46, call 4 (carry [".whl"]): the MoE experts through slab_gemm (moe_prefill's slab, layers/moe.py's
# SLAB_EXPERT_ROWS, new after call 3): the GPU tests it touches, then the 5-layer DeepSeek-V3-shaped and the 12-layer
# Qwen3-30B-A3B-shaped Q4_K models' prompts with the experts on slabs ("mha", the defaults), on the integer GEMMs
# ("mha:::1000000000": dense slabs only, call 3's defaults) and session 45's ("mha:off:float32" / "mha:off");
# the 4-layer gpt-oss-20b F16 file's (MXFP4 experts: 32 of them, top 4) with and without the experts' slabs.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
M=/var/tmp/deepseek-v3-5l-16e-Q4_K.gguf; Q=/var/tmp/qwen3-30b-a3b-12l-Q4_K.gguf; G=/var/tmp/gpt-oss-20b-4l-F16.gguf
mk() { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part "${@:2}" --quiet && mv $1.part $1; }
(mk $M --preset deepseek-v3 --experts 16 --layers 5 --quant Q4_K
 mk $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4
 mk $Q --preset qwen3-30b-a3b --layers 12 --quant Q4_K) > $R/make.log 2>&1 &
have() { while [ ! -f $1 ] && [ $(( $(date +%s) - T0 )) -lt 300 ]; do sleep 2; done; }
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_slab_gemm.py \
  tests/engine/test_kernels.py -k "slab or moe_prefill or int8_moe or kernel_linear or dequantize" \
  > $R/t_slab.txt 2>&1
log "tests slab rc $? $(tail -n 1 $R/t_slab.txt)"; grep -E "^(FAILED|ERROR)|slab experts" $R/t_slab.txt | head -20 >> $OUT/log.txt
snap
have $M
for n in 8000 2000; do
  timeout 100 python3 bench/gpu_box/prompt_profile.py $M --tokens $n --top 10 \
    --ways mha,mha:off:float32,mha:::1000000000,mha --json $R/v3_$n.json > $R/v3_$n.txt 2>&1
  log "v3 $n rc $?"; grep -v Warn $R/v3_$n.txt | grep -v "^  " >> $OUT/log.txt
done
snap
have $G
for n in 8000 2000; do
  timeout 100 python3 bench/gpu_box/prompt_profile.py $G --tokens $n --top 10 \
    --ways mha,mha:::1000000000,mha --json $R/gptoss_$n.json > $R/gptoss_$n.txt 2>&1
  log "gpt-oss $n rc $?"; grep -v Warn $R/gptoss_$n.txt | grep -v "^  " >> $OUT/log.txt
done
snap
have $Q
for n in 2000; do
  timeout 100 python3 bench/gpu_box/prompt_profile.py $Q --tokens $n --top 10 \
    --ways mha,mha:off,mha:::1000000000,mha --json $R/q3_$n.json > $R/q3_$n.txt 2>&1
  log "qwen3 $n rc $?"; grep -v Warn $R/q3_$n.txt | grep -v "^  " >> $OUT/log.txt
done
snap
