#!/usr/bin/env bash
# Session 39, one call (carry [".whl", ".cache"], .cache/old = 136ed8a): session 38's GPU checks that matter most in
# one 10-minute call, and session 39's CUDA plan (SDPA chunks count no scores) against the device's peak.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
Q=/var/tmp/qwen3-30b-4l-Q8_0.gguf
(python3 -m sparkd.engine.cli make-model $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4 \
  --quiet; python3 -m sparkd.engine.cli make-model $Q --preset qwen3-30b-a3b --layers 4 --quant Q8_0 --sparse --quiet) \
  > $R/make.log 2>&1 &
MK=$!
tst() {  # tag timeout files/args...
  local tag=$1 t=$2; shift 2
  timeout $t python3 -m pytest -q -p no:cacheprovider -m gpu "$@" > $R/t_$tag.txt 2>&1
  log "tests $tag rc $? $(tail -n 1 $R/t_$tag.txt)"
}
tst mem 100 tests/engine/test_attention_memory.py
tst chunks 60 tests/engine/test_prompt_chunks.py
tst sdpa 80 tests/engine/test_fused_kernels.py -k "attend or sdpa"
snap
wait $MK
log "made $(ls -la $G $Q | awk '{print $5}' | tr '\n' ' ')"
gen() {  # tag tree [env...] -- args
  local tag=$1 tree=$2; shift 2
  (cd /tmp && env PYTHONPATH=/tmp/site:$tree "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ')"
}
GEN="timeout 70 python3 -m sparkd.engine.cli generate --device cuda --json --resident"
S=1,2,3,4,5,6,7,8
LQ=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
gen torch_1 $NEW $GEN $G --tokens $S -n 64
gen old_1 $OLD $GEN $G --tokens $S -n 64
snap
gen q_8k_1 $NEW $GEN $Q --tokens $LQ -n 32
gen q_old_8k_1 $OLD $GEN $Q --tokens $LQ -n 32
snap
