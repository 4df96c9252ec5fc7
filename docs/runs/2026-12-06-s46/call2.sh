#!/usr/bin/env bash
# Session 46, call 2 (carry [".whl", ".cache"]): kernels/slab_gemm (SPARKD_SLAB_GEMM, new) against the integer GEMM at
# DeepSeek V3's dense shapes (igemm_bench, errors against float64); the 5-layer DeepSeek-V3-shaped Q4_K model's prompt
# by kernel under each MLA form (mha, mha-half) and GEMM (off, bf16, f16); then side by side with llama-bench built
# with CUDA from the vendored source (niced while the rest runs); the GPU tests of the new code.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; W=/var/tmp/sparkd-cuda; mkdir -p $W
export PYTHONPATH=/tmp/site:$NEW
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
OUT=$R/llama WORK=$W BUILD_ONLY=1 nice -n 19 bash bench/gpu_box/cuda_side_by_side.sh > $R/llama_build.log 2>&1 & LB=$!
M=/var/tmp/deepseek-v3-5l-16e-Q4_K.gguf
python3 -m sparkd.engine.cli make-model $M --preset deepseek-v3 --experts 16 --layers 5 --quant Q4_K --quiet \
  > $R/make.log 2>&1 & MK=$!
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_slab_gemm.py \
  tests/engine/test_kernels.py -k "slab or dequantize or embedding or kernel_linear" > $R/t_slab.txt 2>&1
log "tests rc $? $(tail -n 1 $R/t_slab.txt)"; grep -E "^(FAILED|ERROR)" $R/t_slab.txt | head -20 >> $OUT/log.txt
(cd bench && timeout 300 python3 igemm_bench.py --types Q4T,Q8_0,Q6T --grouped '' --tokens 512,2048,8000 \
  --shapes 36864x7168,7168x18432,7168x16384,24576x1536,1536x7168,576x7168 \
  --ways s13,slab-bf16,slab-f16,slab-bf16-256 --repeats 10 --json $R/igemm.json) > $R/igemm.txt 2>&1
log "igemm rc $?"; grep -v Warn $R/igemm.txt >> $OUT/log.txt; snap
wait $MK; log "made $(ls -la $M | awk '{print $5}')"
for n in 8000 2000; do
  timeout 200 python3 bench/gpu_box/prompt_profile.py $M --tokens $n --top 8 \
    --ways mha:off,mha:bf16,mha-half:off,mha-half:bf16,mha-half:f16 --json $R/profile_$n.json > $R/profile_$n.txt 2>&1
  log "profile $n rc $?"; grep -v Warn $R/profile_$n.txt | grep -v "^  " >> $OUT/log.txt
done
snap
wait $LB; log "llama build: $(tail -n 2 $R/llama_build.log | tr '\n' ' ')"
LBIN=$W/llama-cuda/llama-bench
lb() {  # tag args...
  local tag=$1; shift
  [ -x $LBIN ] && timeout 100 $LBIN -o json -m $M -ngl 99 -fa 0 "$@" > $R/llama_$tag.json 2> $R/llama_$tag.err
  log "llama-bench $tag rc $?: $(grep -o '"avg_ts": [0-9.e+]*' $R/llama_$tag.json 2>/dev/null | tr '\n' ' ')"
}
gen() {  # tag [env...] -- args
  local tag=$1; shift
  (cd /tmp && env "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*' $R/gen_$tag.json | tr '\n' ' ')"
}
GEN="timeout 100 python3 -m sparkd.engine.cli generate --device cuda --json --resident"
L2=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
L8=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
gen warm $GEN $M --tokens $L8 -n 8
lb prompt1 -p 2000,8000 -n 0 -r 2
for w in "off mha" "bf16 mha" "bf16 mha-half"; do
  set -- $w
  gen p8k_$1_$2 SPARKD_SLAB_GEMM=$1 SPARKD_MLA_PROMPT=$2 $GEN $M --tokens $L8 -n 16
  gen p2k_$1_$2 SPARKD_SLAB_GEMM=$1 SPARKD_MLA_PROMPT=$2 $GEN $M --tokens $L2 -n 16
  snap
done
[ $(( $(date +%s) - T0 )) -lt 520 ] && lb prompt2 -p 2000,8000 -n 0 -r 2
snap
