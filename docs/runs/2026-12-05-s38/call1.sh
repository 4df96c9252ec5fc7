#!/usr/bin/env bash
# Session 38, call 1 (carry [".whl", ".cache"], .cache/old = 136ed8a). Session 37's call3.sh (the ring bucket fix and
# SPARKD_HALF_PROMPT's GPU tests; generate on the gpt-oss F16 file torch / kernel / old) plus session 38's GQA
# attention per KV head (attend's per-group products, attend_sdpa's stride-0 keys): its GPU tests (bits against the
# repeated rows, CUDA's peak allocation) and generate on a qwen3-30b-a3b-shaped Q8_0 file (SDPA prompts) new / old.
# Two parts, one a call (600 s each): `bash call1.sh tests`, then `bash call1.sh gen` (test_cuda_graphs, timings).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
PART=${1:-tests}; R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
Q=/var/tmp/qwen3-30b-4l-Q8_0.gguf
tst() {  # tag timeout files/args...
  local tag=$1 t=$2; shift 2
  timeout $t python3 -m pytest -q -p no:cacheprovider -x -m gpu "$@" > $R/t_$tag.txt 2>&1
  log "tests $tag rc $? $(tail -n 1 $R/t_$tag.txt)"
}
if [ $PART = tests ]; then
  tst mem 120 tests/engine/test_attention_memory.py
  tst sdpa 100 tests/engine/test_fused_kernels.py -k "attend or sdpa"
  tst ring 120 tests/engine/test_swa_ring.py
  tst half 60 tests/engine/test_kernels.py -k 16_bit_prompt
  tst mla 90 tests/engine/test_mla_prompt.py
  snap; exit
fi
(python3 -m sparkd.engine.cli make-model $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4 \
  --quiet; python3 -m sparkd.engine.cli make-model $Q --preset qwen3-30b-a3b --layers 4 --quant Q8_0 --sparse --quiet) \
  > $R/make.log 2>&1 &
MK=$!
tst graphs 200 tests/engine/test_cuda_graphs.py
wait $MK
log "made $(ls -la $G $Q | awk '{print $5}' | tr '\n' ' ')"
snap
gen() {  # tag tree [env...] -- args
  local tag=$1 tree=$2; shift 2
  (cd /tmp && env PYTHONPATH=/tmp/site:$tree "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ')"
}
GEN="timeout 90 python3 -m sparkd.engine.cli generate --device cuda --json --resident"
S=1,2,3,4,5,6,7,8
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
LQ=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
for r in 1; do
  gen torch_$r $NEW $GEN $G --tokens $S -n 64
  gen kernel_$r $NEW SPARKD_HALF_PROMPT=kernel $GEN $G --tokens $S -n 64
  gen old_$r $OLD $GEN $G --tokens $S -n 64
  gen torch_2k_$r $NEW $GEN $G --tokens $LT -n 64
  gen kernel_2k_$r $NEW SPARKD_HALF_PROMPT=kernel $GEN $G --tokens $LT -n 64
  gen old_2k_$r $OLD $GEN $G --tokens $LT -n 64
  gen q_8k_$r $NEW $GEN $Q --tokens $LQ -n 32
  gen q_old_8k_$r $OLD $GEN $Q --tokens $LQ -n 32
  snap
done
python3 bench/attend_bench.py --device cuda --json $R/attend_cuda_new.json > $R/attend_new.txt 2>&1
PYTHONPATH=/tmp/site:$OLD python3 bench/attend_bench.py --device cuda --json $R/attend_cuda_old.json > $R/attend_old.txt 2>&1
log "attend_bench new: $(cat $R/attend_new.txt | tr '\n' '|')"
log "attend_bench old: $(cat $R/attend_old.txt | tr '\n' '|')"
snap
