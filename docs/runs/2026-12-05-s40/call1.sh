#!/usr/bin/env bash
# Session 40, call 1 (carry [".whl", ".cache"], .cache/old = 136ed8a): which form of GQA SDPA's fast kernel takes
# (bench/sdpa_gqa_bench.py), session 39's revert of the stride-0 keys (8000-token prompt new / old), the GPU tests
# session 39 fixed or added (unit bounds, the resident plan's device bytes), then session 38's rest (rings, half
# prompts, MLA prompts, graphs, attend_bench). Each step snapshots, so a timeout keeps what ran.
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
timeout 90 python3 bench/sdpa_gqa_bench.py --json $R/sdpa.json > $R/sdpa.txt 2>&1
log "sdpa bench rc $?"; cat $R/sdpa.txt >> $OUT/log.txt; snap
tst() {  # tag timeout files/args...
  local tag=$1 t=$2; shift 2
  timeout $t python3 -m pytest -q -p no:cacheprovider -m gpu "$@" > $R/t_$tag.txt 2>&1
  log "tests $tag rc $? $(tail -n 1 $R/t_$tag.txt)"
}
tst mem 100 tests/engine/test_attention_memory.py
tst plan 60 tests/engine/test_resident_plan.py tests/engine/test_prompt_chunks.py
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
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
LQ=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
gen q_8k_1 $NEW $GEN $Q --tokens $LQ -n 32
gen q_old_8k_1 $OLD $GEN $Q --tokens $LQ -n 32
gen torch_1 $NEW $GEN $G --tokens $S -n 64
gen old_1 $OLD $GEN $G --tokens $S -n 64
snap
gen torch_2k_1 $NEW $GEN $G --tokens $LT -n 64
gen kernel_2k_1 $NEW SPARKD_HALF_PROMPT=kernel $GEN $G --tokens $LT -n 64
gen old_2k_1 $OLD $GEN $G --tokens $LT -n 64
gen q_8k_2 $NEW $GEN $Q --tokens $LQ -n 32
gen q_old_8k_2 $OLD $GEN $Q --tokens $LQ -n 32
snap
tst sdpa 80 tests/engine/test_fused_kernels.py -k "attend or sdpa"
tst ring 100 tests/engine/test_swa_ring.py
tst half 50 tests/engine/test_kernels.py -k 16_bit_prompt
snap
tst mla 80 tests/engine/test_mla_prompt.py
snap
