#!/usr/bin/env bash
# Session 44, call 4 (carry [".whl"]; the budget's last ~3 minutes, so call 3's model runs are left out):
# SPARKD_SDPA_PRECISION=half's GPU test (against attend in float64) and sdpa_micro.py (gpt-oss-20b's heads).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/log.txt
timeout 60 python3 docs/runs/2026-12-06-s44/sdpa_micro.py 2>&1 | grep -v Warn >> $OUT/log.txt
timeout 80 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/engine/test_fused_kernels.py -k "half_over" 2>&1 \
  | grep -E "^half|passed|failed|Error" >> $OUT/log.txt
