#!/usr/bin/env bash
# graphs12's second device call (H200, cold box; carry [".whl", ".xfer/graphs12"], run from
# .xfer/graphs12), after the first one's out-of-memory test aborted the process: torch 2.11 frees a
# graph whose capture_begin ran out of memory (registering with the default generator) with
# "The graph should be registered to the state" and std::terminate. With graph_capture's anchor graph:
# the GPU tests of test_cuda_graphs.py and test_device_argmax.py again, and prompt_pool_order.py
# (the shared pool after every bucket captured shortest first / longest first / 1024 alone).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
log start
E=tests/engine
timeout 55 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE $E/test_cuda_graphs.py -k "out_of_memory or margin or at_load" > $R/gpu_tests_new.log 2>&1 & P=$!
timeout 55 python3 bench/gpu_box/prompt_pool_order.py --json $R/pool_order.json > $R/pool_order.log 2>&1 & Q=$!
timeout 55 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $E/test_cuda_graphs.py $E/test_device_argmax.py -k "not (out_of_memory or margin or at_load)" > $R/gpu_tests_rest.log 2>&1
log "tests rest rc $?: $(tail -1 $R/gpu_tests_rest.log)"
wait $P; log "tests new rc $?: $(tail -1 $R/gpu_tests_new.log)"
grep -h "failed capture:\|prompt graph stats\|^FAILED\|^ERROR\|Error\|assert" $R/gpu_tests_*.log | head -30 | tee -a $R/log.txt
wait $Q; log "pool order rc $?: $(tail -2 $R/pool_order.log)"
log done
cp $R/log.txt $OUT/; cd /tmp && tar czf $OUT/res.tgz res
