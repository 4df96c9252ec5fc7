#!/usr/bin/env bash
# Session 37, call 3 (carry [".whl", ".cache"], .cache/old = 136ed8a). After call 2: a ring layer's decode rows are the
# whole ring at every bucket (its GPU test), and F16 / BF16 prompts through cuBLAS over the widened values
# (SPARKD_HALF_PROMPT=torch, the default; its GPU test): generate on the 4-layer gpt-oss-20b F16 file, new (torch),
# new with SPARKD_HALF_PROMPT=kernel (call 2's GEMM) and the old tree, 8- and 2000-token prompts, interleaved.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res3; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res3; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
[ -f $G ] || python3 -m sparkd.engine.cli make-model $G --preset gpt-oss-20b --layers 4 --quant F16 \
  --tensor-type _exps=MXFP4 --quiet > $R/make.log 2>&1 &
MK=$!
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_swa_ring.py tests/engine/test_kernels.py \
  -k "shorter or 16_bit_prompt" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
wait $MK
snap
gen() {  # tag tree [env...] -- args
  local tag=$1 tree=$2; shift 2
  (cd /tmp && env PYTHONPATH=/tmp/site:$tree "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ')"
}
GEN="timeout 90 python3 -m sparkd.engine.cli generate $G --device cuda --json --resident"
S=1,2,3,4,5,6,7,8
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
for r in 1 2; do
  gen torch_$r $NEW $GEN --tokens $S -n 64
  gen kernel_$r $NEW SPARKD_HALF_PROMPT=kernel $GEN --tokens $S -n 64
  gen old_$r $OLD $GEN --tokens $S -n 64
  gen torch_2k_$r $NEW $GEN --tokens $LT -n 64
  gen kernel_2k_$r $NEW SPARKD_HALF_PROMPT=kernel $GEN --tokens $LT -n 64
  gen old_2k_$r $OLD $GEN --tokens $LT -n 64
  snap
done
