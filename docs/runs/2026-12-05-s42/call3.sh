#!/usr/bin/env bash
# Session 42, call 3 (carry [".whl", ".cache"], .cache/old = a28a47d's sparkd): at 8add51f + SPARKD_HALF_PROMPT=half:
# the GPU tests the MXFP4 tile, the window blocks and the half GEMM touch; the 4-layer gpt-oss file's prompts new /
# new with half / old interleaved after untimed warm-ups; the 8000-token prompt's profile with half.
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
tst kernels 150 tests/engine/test_nibble_tiles.py tests/engine/test_kernels.py -k "tiled_moe_prefill or int8_grouped or int8_moe_prefill or 16_bit_prompt or tiled_integer"
snap
wait $MK; log "made $(ls -la $G | awk '{print $5}')"
gen() {  # tag tree [env...] -- args
  local tag=$1 tree=$2; shift 2
  (cd /tmp && env PYTHONPATH=/tmp/site:$tree "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*' $R/gen_$tag.json | tr '\n' ' ')"
}
GEN="timeout 80 python3 -m sparkd.engine.cli generate --device cuda --json --resident"
L2=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
L8=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
gen warm_new $NEW $GEN $G --tokens $L8 -n 8
gen warm_half $NEW SPARKD_HALF_PROMPT=half $GEN $G --tokens $L8 -n 8
gen warm_old $OLD $GEN $G --tokens $L8 -n 8
for r in 1 2; do
  gen p8k_new_$r $NEW $GEN $G --tokens $L8 -n 16
  gen p8k_half_$r $NEW SPARKD_HALF_PROMPT=half $GEN $G --tokens $L8 -n 16
  gen p8k_old_$r $OLD $GEN $G --tokens $L8 -n 16
done
for r in 1 2; do
  gen p2k_new_$r $NEW $GEN $G --tokens $L2 -n 16
  gen p2k_half_$r $NEW SPARKD_HALF_PROMPT=half $GEN $G --tokens $L2 -n 16
  gen p2k_old_$r $OLD $GEN $G --tokens $L2 -n 16
done
snap
SPARKD_HALF_PROMPT=half timeout 120 python3 bench/gpu_box/prompt_profile.py $G --tokens 8000 --ways mha --top 25 \
  --json $R/profile.json > $R/profile.txt 2>&1; log "profile rc $?"
snap
tst engine 200 tests/engine/test_kernel_engine.py tests/engine/test_mxfp4.py -k "oss or gpt or sink or swa or mxfp4 or MXFP4"
snap
