#!/usr/bin/env bash
# Session 45, call 2 (carry [".whl"]): call 1's 0.26 at 8000 tokens, half's error or the model's sensitivity?
# sdpa_ref.py on the 4-layer gpt-oss-20b F16 file (float32, half and float32 with the queries one ulp up, each against
# float64 attention), and the engine's GPU tests under SPARKD_SDPA_PRECISION=half while the file is written.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; log "$(cat $R/gpu.txt)"
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
python3 -m sparkd.engine.cli make-model $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4 \
  --quiet > $R/make.log 2>&1 &
MK=$!
SPARKD_SDPA_PRECISION=half timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 6 tests/engine/test_kernel_engine.py \
  tests/engine/test_fused_kernels.py tests/engine/test_mla_prompt.py tests/engine/test_kv_f16.py \
  tests/engine/test_attention_memory.py tests/engine/test_eager_decode.py > $R/t_half.txt 2>&1
log "tests (half) rc $? $(tail -n 1 $R/t_half.txt)"; grep -E "^(FAILED|ERROR)" $R/t_half.txt | head -20 >> $OUT/log.txt
snap
wait $MK; log "made $(ls -la $G | awk '{print $5}')"
timeout 200 python3 docs/runs/2026-12-06-s45/sdpa_ref.py $G 2000 8000 2>&1 | grep -v Warn > $R/sdpa_ref.txt
log "sdpa_ref rc $?"; cat $R/sdpa_ref.txt >> $OUT/log.txt
snap
