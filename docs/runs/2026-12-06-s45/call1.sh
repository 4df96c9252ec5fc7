#!/usr/bin/env bash
# Session 45, call 1 (carry [".whl"]): session 44's call 4 and call 3 in one, neither of which found a machine.
# SPARKD_SDPA_PRECISION=half (float16 queries over the cache's float16 rows, as llama.cpp's attention) against float32:
# sdpa_micro.py at gpt-oss-20b's heads, the GPU test against float64, the prompt-graph groups under half, then on the
# 4-layer gpt-oss-20b F16 file sdpa_half.py (last logits' difference, forward times, interleaved) and generate's prompt
# tok/s at 2000 / 8000 tokens, modes interleaved after a warm-up.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD
export PYTHONPATH=/tmp/site:$NEW
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
timeout 60 python3 docs/runs/2026-12-06-s44/sdpa_micro.py 2>&1 | grep -v Warn > $R/micro.txt
log "micro rc $?"; cat $R/micro.txt >> $OUT/log.txt
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
python3 -m sparkd.engine.cli make-model $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4 \
  --quiet > $R/make.log 2>&1 &
MK=$!
timeout 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/engine/test_fused_kernels.py \
  -k "half_over or attend_sdpa_matches" > $R/t_half.txt 2>&1; log "tests half rc $? $(tail -n 1 $R/t_half.txt)"
grep -E "^half|FAILED|Error" $R/t_half.txt | head -20 >> $OUT/log.txt
SPARKD_SDPA_PRECISION=half timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_cuda_graphs.py \
  tests/engine/test_prompt_chunks.py tests/engine/test_swa_ring.py > $R/t_graphs.txt 2>&1
log "tests graphs (half) rc $? $(tail -n 1 $R/t_graphs.txt)"; grep -E "^(FAILED|ERROR)" $R/t_graphs.txt | head >> $OUT/log.txt
snap
wait $MK; log "made $(ls -la $G | awk '{print $5}')"
timeout 120 python3 docs/runs/2026-12-06-s44/sdpa_half.py $G 2000 8000 2>&1 | grep -v Warn > $R/sdpa_half.txt
log "sdpa_half rc $?"; cat $R/sdpa_half.txt >> $OUT/log.txt
snap
gen() {  # tag env... -- args
  local tag=$1; shift
  (cd /tmp && env "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*' $R/gen_$tag.json | tr '\n' ' ')"
}
GEN="timeout 60 python3 -m sparkd.engine.cli generate --device cuda --json --resident"
L2=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
L8=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
gen warm_f SPARKD_SDPA_PRECISION=float32 $GEN $G --tokens $L8 -n 4
gen warm_h SPARKD_SDPA_PRECISION=half $GEN $G --tokens $L8 -n 4
for r in 1 2; do
  for m in float32 half; do
    gen p8k_${m}_$r SPARKD_SDPA_PRECISION=$m $GEN $G --tokens $L8 -n 4
    gen p2k_${m}_$r SPARKD_SDPA_PRECISION=$m $GEN $G --tokens $L2 -n 4
  done
done
snap
