#!/usr/bin/env bash
# Session 43, call 3 (carry [".whl"]): iq2xs_layers.py on the GPU, IQ2_XS and IQ2_XXS (which passes), prompt graphs
# off (forward hooks see eager outputs only).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
export PYTHONPATH=/tmp/site:$PWD SPARKD_PREFILL_GRAPHS=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
timeout 150 python3 docs/runs/2026-12-06-s43/iq2xs_layers.py IQ2_XS 2>&1 | grep -v Warn | tee -a $OUT/log.txt
timeout 100 python3 docs/runs/2026-12-06-s43/iq2xs_layers.py IQ2_XXS 2>&1 | grep -v Warn | tee -a $OUT/log.txt
