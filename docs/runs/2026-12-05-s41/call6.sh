#!/usr/bin/env bash
# Session 41, call 6: where gpt-oss's 8000-token prompt goes at 234f0c5 (bench/gpu_box/prompt_profile.py, one eager
# forward kernel by kernel), for the next session: llama-bench's prompt is ~2x sparkd's (call 2).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
python3 -m sparkd.engine.cli make-model $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4 \
  --quiet > $R/make.log 2>&1; log "made rc $?"
timeout 150 python3 bench/gpu_box/prompt_profile.py $G --tokens 8000 --ways mha --top 25 --json $R/profile.json \
  > $R/profile.txt 2>&1; log "profile rc $?"
snap
