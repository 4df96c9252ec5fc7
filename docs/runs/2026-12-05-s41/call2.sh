#!/usr/bin/env bash
# Session 41, call 2 (carry [".whl", ".cache"], .cache/old = bb615df's sparkd): the half GEMV before / after f7538a7
# timed as a pair of warm rows each, trees interleaved (call 1's first row of a shape ran slow in both trees); llama.cpp
# built with CUDA in the background, then, quiet, llama-bench against sparkd on the 4-layer gpt-oss-20b F16 file
# (decode; 2000- and 8000-token prompts, SPARKD_HALF_PROMPT torch and kernel). Each step snapshots.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; OLD=$PWD/.cache/old; W=/var/tmp/sparkd-cuda; mkdir -p $W
export PYTHONPATH=/tmp/site:$NEW
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
OUT=$R/llama WORK=$W BUILD_ONLY=1 bash bench/gpu_box/cuda_side_by_side.sh > $R/llama_build.log 2>&1 & LB=$!
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
python3 -m sparkd.engine.cli make-model $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4 \
  --quiet > $R/make.log 2>&1 &
MK=$!
sweep() {  # tag tree
  (cd /tmp && timeout 90 env PYTHONPATH=/tmp/site:$2 python3 $NEW/bench/gpu_box/half_gemv_sweep.py \
    --tiles default,default --json $R/sweep_$1.json > $R/sweep_$1.txt 2>&1); log "sweep $1 rc $?"
}
sweep old1 $OLD; sweep new1 $NEW; sweep old2 $OLD; sweep new2 $NEW
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
gen warm $NEW $GEN $G --tokens 1,2,3,4,5,6,7,8 -n 64
lb decode -p 0 -n 128 -r 3
gen d_new_1 $NEW $GEN $G --tokens 1,2,3,4,5,6,7,8 -n 128
gen d_new_2 $NEW $GEN $G --tokens 1,2,3,4,5,6,7,8 -n 128
lb prompt -p 2000,8000 -n 0 -r 2
snap
gen p8k_kernel_0 $NEW SPARKD_HALF_PROMPT=kernel $GEN $G --tokens $L8 -n 4
for r in 1 2; do
  gen p8k_torch_$r $NEW $GEN $G --tokens $L8 -n 4
  gen p8k_kernel_$r $NEW SPARKD_HALF_PROMPT=kernel $GEN $G --tokens $L8 -n 4
done
snap
gen p2k_torch_1 $NEW $GEN $G --tokens $L2 -n 4
gen p2k_kernel_1 $NEW SPARKD_HALF_PROMPT=kernel $GEN $G --tokens $L2 -n 4
snap
