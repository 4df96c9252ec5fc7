#!/usr/bin/env bash
# Session 43, call 2 (carry [".whl", ".cache"]; .cache/old = a0bc218's sparkd, the session's start): MXFP4's tiled
# grouped GEMM on bf16 blocks with their scales folded in (mxfp4_tiled.fblock, the new default) and the IQ2_XS-ieee
# GPU failure (call 1: 5.86e-3 at this code and at a28a47d).
# 1. iq2xs_diag.py: IQ2_XS / IQ2_S / IQ2_XXS / IQ4_NL float and integer GEMMs, grouped GEMMs and the GEMV against the
#    CPU reference's dequantized product; then the failing test with one switch off a process.
# 2. The fold's GPU tests (test_nibble_tiles, test_mxfp4, test_kernels' integer GEMM cases), igemm_bench (s13 = the
#    fold against the integer launch 128/64/4/1/0/0: bits and time), the 4-layer gpt-oss-20b F16 file's prompts of
#    2000 and 8000 tokens new / old interleaved.
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
timeout 100 python3 docs/runs/2026-12-06-s43/iq2xs_diag.py > $R/diag.txt 2>&1; log "diag rc $?"
cat $R/diag.txt >> $OUT/log.txt
VP=""
for v in base SPARKD_PREFILL_GRAPHS=0 SPARKD_PREFILL_FLOAT_GEMM=kernel SPARKD_MOE_PREFILL=loop SPARKD_FUSED_KERNELS=none \
         SPARKD_PROMPT_LOGITS=all SPARKD_IQ2_XS_INT=0; do
  (env $([ $v = base ] || echo $v) timeout 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu \
     tests/engine/test_kernel_engine.py -k "test_kernel_path_matches_cpu_reference and IQ2_XS and ieee" > $R/v_$v.txt 2>&1
   log "variant $v: $(grep -o 'relative error [0-9.e+-]*' $R/v_$v.txt | tr '\n' ' ') $(tail -n 1 $R/v_$v.txt)") &
  VP="$VP $!"
done
wait $VP
snap
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 3 tests/engine/test_nibble_tiles.py tests/engine/test_mxfp4.py \
  > $R/t_fold.txt 2>&1; log "fold tests rc $? $(tail -n 1 $R/t_fold.txt)"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu -n 3 tests/engine/test_kernels.py \
  -k "int8_grouped or int8_moe_prefill or tiled_integer or integer_gemm" > $R/t_kern.txt 2>&1
log "kernel tests rc $? $(tail -n 1 $R/t_kern.txt)"
grep -hE "^(FAILED|ERROR)" $R/t_fold.txt $R/t_kern.txt | head | tee -a $OUT/log.txt
IG="python3 bench/igemm_bench.py --types MXFP4T --grouped-types MXFP4T --shapes '' --grouped 2880x2880 --experts 32 --top-k 4 --tokens 2000,8000 --block-t 64"
eval timeout 100 $IG --ways s13,128/64/4/1/0/0,s13,128/64/4/1/0/0 --json $R/ig.json > $R/ig.txt 2>&1; log "ig rc $?"
cat $R/ig.txt >> $OUT/log.txt
snap
wait $MK; log "made $(ls -la $G | awk '{print $5}')"
gen() {  # tag tree args
  local tag=$1 tree=$2; shift 2
  (cd /tmp && env PYTHONPATH=/tmp/site:$tree timeout 80 python3 -m sparkd.engine.cli generate --device cuda --json \
    --resident $G "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*' $R/gen_$tag.json | tr '\n' ' ')"
}
L2=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
L8=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
gen warm $NEW --tokens $L8 -n 4
for r in 1 2; do
  gen p8k_new_$r $NEW --tokens $L8 -n 4; gen p8k_old_$r $OLD --tokens $L8 -n 4
  gen p2k_new_$r $NEW --tokens $L2 -n 4; gen p2k_old_$r $OLD --tokens $L2 -n 4
done
snap
