#!/usr/bin/env bash
# Session 45, call 3 (carry [".whl", ".cache"]): SPARKD_SDPA_PRECISION=half, now the default, side by side with
# llama.cpp on the 4-layer gpt-oss-20b F16 file (prompts of 2000 and 8000 tokens; half and float32 interleaved) and
# the engine's GPU test groups at this code (the half tests fixed after call 2) while llama.cpp builds (niced).
# Session 44's call 2 otherwise; decode left out (half does not touch it), the 2000-token prompt one round
# (the budget's last ~11 minutes).
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
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
python3 -m sparkd.engine.cli make-model $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4 \
  --quiet > $R/make.log 2>&1 &
MK=$!
tst() {  # tag timeout files/args...
  local tag=$1 t=$2; shift 2
  timeout $t python3 -m pytest -q -p no:cacheprovider -m gpu "$@" > $R/t_$tag.txt 2>&1
  log "tests $tag rc $? $(tail -n 1 $R/t_$tag.txt)"
}
tst engine 300 -s tests/engine/test_kernel_engine.py tests/engine/test_attention_memory.py & TA=$!
tst kernels 300 -n 3 tests/engine/test_fused_kernels.py tests/engine/test_mxfp4.py tests/engine/test_eager_decode.py \
  tests/engine/test_cuda_graphs.py tests/engine/test_prompt_chunks.py tests/engine/test_swa_ring.py \
  tests/engine/test_kv_f16.py tests/engine/test_mla_prompt.py & TB=$!
wait $TA $TB
grep -hE "^(FAILED|ERROR)|^half|relative error" $R/t_engine.txt $R/t_kernels.txt | head -60 >> $OUT/log.txt
snap
wait $MK; log "made $(ls -la $G | awk '{print $5}')"
wait $LB; log "llama build: $(tail -n 2 $R/llama_build.log | tr '\n' ' ')"
LBIN=$W/llama-cuda/llama-bench
lb() {  # tag args...
  local tag=$1; shift
  [ -x $LBIN ] && timeout 80 $LBIN -o json -m $G -ngl 99 -fa 0 "$@" > $R/llama_$tag.json 2> $R/llama_$tag.err
  log "llama-bench $tag rc $?: $(grep -o '"avg_ts": [0-9.e+]*' $R/llama_$tag.json 2>/dev/null | tr '\n' ' ')"
}
gen() {  # tag tree [env...] -- args
  local tag=$1 tree=$2; shift 2
  (cd /tmp && env PYTHONPATH=/tmp/site:$tree "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*' $R/gen_$tag.json | tr '\n' ' ')"
}
GEN="timeout 80 python3 -m sparkd.engine.cli generate --device cuda --json --resident"
L2=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
L8=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
gen warm $NEW $GEN $G --tokens $L8 -n 8
lb prompt1 -p 2000,8000 -n 0 -r 2
for r in 1 2; do
  for m in half float32; do
    gen p8k_${m}_$r $NEW SPARKD_SDPA_PRECISION=$m $GEN $G --tokens $L8 -n 16; snap
    [ $r = 1 ] && gen p2k_${m}_$r $NEW SPARKD_SDPA_PRECISION=$m $GEN $G --tokens $L2 -n 16
  done
done
lb prompt2 -p 2000,8000 -n 0 -r 2
snap
