#!/usr/bin/env bash
# Session 41, call 1 (carry [".whl", ".cache"], .cache/old = bb615df's sparkd, the half GEMV before): the F16 / BF16 GEMV with its weights typed
# before they are indexed (128-bit loads; they were 16-bit loads, 8 a thread and group: offline SASS).
# The sweep in this tree (every tile) and the old default; gpt-oss-20b-shaped 4-layer F16 decode and 2000-token
# prompt new / old interleaved after an untimed warm-up, SPARKD_HALF_PROMPT=kernel again; the half GPU tests; then the
# Q4_KXD layer's floor rows at 4096x1536 if time is left. Each step snapshots, so a timeout keeps what ran.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
python3 -m sparkd.engine.cli make-model $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4 \
  --quiet > $R/make.log 2>&1 &
MK=$!
tst() {  # tag timeout files/args...
  local tag=$1 t=$2; shift 2
  timeout $t python3 -m pytest -q -p no:cacheprovider -m gpu "$@" > $R/t_$tag.txt 2>&1
  log "tests $tag rc $? $(tail -n 1 $R/t_$tag.txt)"
}
tst half 120 tests/engine/test_kernels.py tests/engine/test_kernel_engine.py -k "F16 or BF16 or half"
snap
(cd /tmp && timeout 60 env PYTHONPATH=/tmp/site:$OLD python3 $NEW/bench/gpu_box/half_gemv_sweep.py --tiles default \
  --json $R/sweep_old.json > $R/sweep_old.txt 2>&1); log "sweep old rc $?"
timeout 260 python3 bench/gpu_box/half_gemv_sweep.py --json $R/sweep_new.json > $R/sweep_new.txt 2>&1
log "sweep new rc $?"
snap
wait $MK
log "made $(ls -la $G | awk '{print $5}')"
gen() {  # tag tree [env...] -- args
  local tag=$1 tree=$2; shift 2
  (cd /tmp && env PYTHONPATH=/tmp/site:$tree "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*' $R/gen_$tag.json | tr '\n' ' ')"
}
GEN="timeout 70 python3 -m sparkd.engine.cli generate --device cuda --json --resident"
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
gen warm_new $NEW $GEN $G --tokens 1,2,3,4,5,6,7,8 -n 64
gen warm_old $OLD $GEN $G --tokens 1,2,3,4,5,6,7,8 -n 64
for r in 1 2; do
  gen d_new_$r $NEW $GEN $G --tokens 1,2,3,4,5,6,7,8 -n 128
  gen d_old_$r $OLD $GEN $G --tokens 1,2,3,4,5,6,7,8 -n 128
done
snap
gen p_kernel_0 $NEW SPARKD_HALF_PROMPT=kernel $GEN $G --tokens $LT -n 4
for r in 1 2; do
  gen p_torch_$r $NEW $GEN $G --tokens $LT -n 4
  gen p_kernel_$r $NEW SPARKD_HALF_PROMPT=kernel $GEN $G --tokens $LT -n 4
  gen p_oldkernel_$r $OLD SPARKD_HALF_PROMPT=kernel $GEN $G --tokens $LT -n 4
done
snap
PYTHONPATH=/tmp/site:$NEW:$NEW/bench timeout 150 python3 bench/moe_tiles_bench.py --types Q4_KXD --sets new \
  --shapes 4096x1536x8 --floor --defaults-only --compile-workers 8 --json $R/moe_floor.json > $R/moe_floor.txt 2>&1
log "moe floor rc $?"
snap
