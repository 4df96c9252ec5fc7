#!/usr/bin/env bash
# Session 44, call 2 (carry [".whl", ".cache"]): the engine's GPU test groups at this session's code (the kernel model
# against the reference within STEP_BOUND: the IQ2_XS-ieee case) while llama.cpp builds with CUDA (niced); then
# llama-bench and sparkd side by side on the 4-layer gpt-oss-20b F16 file (MXFP4 experts; session 43's folded
# scales had no llama.cpp beside them): prompts of 2000 and 8000 tokens, decode. Session 42's call 4, as it was.
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
tst engine 300 -s tests/engine/test_kernel_engine.py & TA=$!
tst kernels 300 tests/engine/test_fused_kernels.py tests/engine/test_nibble_tiles.py tests/engine/test_mxfp4.py \
  tests/engine/test_eager_decode.py & TB=$!
wait $TA $TB
grep -hE "^(FAILED|ERROR)|relative error" $R/t_engine.txt $R/t_kernels.txt | head -60 >> $OUT/log.txt
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
  gen p8k_$r $NEW $GEN $G --tokens $L8 -n 16
  gen p2k_$r $NEW $GEN $G --tokens $L2 -n 16
done
lb prompt2 -p 2000,8000 -n 0 -r 2
snap
lb decode -p 0 -n 128 -r 3
gen d_1 $NEW $GEN $G --tokens 1,2,3,4,5,6,7,8 -n 128
gen d_2 $NEW $GEN $G --tokens 1,2,3,4,5,6,7,8 -n 128
snap
