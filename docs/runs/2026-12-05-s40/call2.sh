#!/usr/bin/env bash
# Session 40, call 2 (carry [".whl", ".cache"], .cache/old = 136ed8a): the stride-0 attend_sdpa back (35684a0).
# Its GPU tests; generate timings after a cold-cache demonstration (the old tree with an empty TRITON_CACHE_DIR: is
# a first run's prompt slow without any change of code?), then new / old interleaved on a warm cache; attend_bench
# on CUDA; the CUDA graph tests last. Each step snapshots, so a timeout keeps what ran.
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
tst plan 60 tests/engine/test_resident_plan.py tests/engine/test_prompt_chunks.py
tst sdpa 80 tests/engine/test_fused_kernels.py -k "attend or sdpa"
tst mla 80 tests/engine/test_mla_prompt.py
snap
wait $MK
log "made $(ls -la $G $Q | awk '{print $5}' | tr '\n' ' ')"
gen() {  # tag tree [env...] -- args
  local tag=$1 tree=$2; shift 2
  (cd /tmp && env PYTHONPATH=/tmp/site:$tree "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ')"
}
GEN="timeout 70 python3 -m sparkd.engine.cli generate --device cuda --json --resident"
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
LQ=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
gen q_old_cold $OLD TRITON_CACHE_DIR=/tmp/tc_cold $GEN $Q --tokens $LQ -n 32
gen q_old_warm $OLD TRITON_CACHE_DIR=/tmp/tc_cold $GEN $Q --tokens $LQ -n 32
gen q_8k_0 $NEW $GEN $Q --tokens $LQ -n 32
for r in 1 2; do
  gen q_8k_$r $NEW $GEN $Q --tokens $LQ -n 32
  gen q_old_8k_$r $OLD $GEN $Q --tokens $LQ -n 32
done
gen torch_2k_0 $NEW $GEN $G --tokens $LT -n 64
gen torch_2k_1 $NEW $GEN $G --tokens $LT -n 64
gen old_2k_1 $OLD $GEN $G --tokens $LT -n 64
snap
timeout 60 python3 bench/attend_bench.py --device cuda --json $R/attend_cuda_new.json > $R/attend_new.txt 2>&1
log "attend_bench new rc $?"
PYTHONPATH=/tmp/site:$OLD timeout 60 python3 bench/attend_bench.py --device cuda --json $R/attend_cuda_old.json \
  > $R/attend_old.txt 2>&1
log "attend_bench old rc $?"
snap
tst graphs 150 tests/engine/test_cuda_graphs.py
snap
