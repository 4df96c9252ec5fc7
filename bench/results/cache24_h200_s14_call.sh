#!/usr/bin/env bash
# cache24 (session 14): the prompt store on the H200 in one call. The 12-layer qwen3-30b-a3b Q8_0 test
# model made in the background (as docs/runs/2026-12-01-s13-final/call.sh) while the gpu-marked prompt
# cache tests run (tests/engine/test_prompt_cache.py: one conversation, and two taking turns through the
# store's device copies; test_cuda_graphs.py: the continued prompt graphs and Engine.generate with and
# without graphs), then bench/gpu_box/prompt_cache_bench.py --ab: two chats taking turns, first-token
# time with the store against the single cache. Results: $OUT/res.tgz.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
R=/tmp/res; mkdir -p $R; M=/tmp/q3-12-Q8_0.gguf
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
snap() { tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
(timeout 60 python3 -m sparkd.engine.cli make-model $M --preset qwen3-30b-a3b --quant Q8_0 --quiet --layers 12) > $R/make.log 2>&1 & MK=$!
timeout 58 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE -s tests/engine/test_prompt_cache.py > $R/gpu_tests_1.log 2>&1 & T1=$!
timeout 58 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_cuda_graphs.py \
  -k "continued or engine_generate" > $R/gpu_tests_2.log 2>&1 & T2=$!
wait $T1; log "gpu tests 1 rc $? $(tail -1 $R/gpu_tests_1.log)"
wait $T2; log "gpu tests 2 rc $? $(tail -1 $R/gpu_tests_2.log)"
grep -h "^FAILED\|^ERROR\|logits gap" $R/gpu_tests_*.log | tee -a $R/log.txt; snap
wait $MK; log "model rc $? $(ls -la $M 2>&1 | awk '{print $5}')"
timeout 50 python3 bench/gpu_box/prompt_cache_bench.py --model $M --ab --turn1 512,1536 --reps 3 \
  --json $R/prompt_store_ab.json > $R/bench_ab.log 2>&1
log "bench ab rc $?: $(grep 'A/B' $R/bench_ab.log | tr '\n' ';')"; tail -3 $R/bench_ab.log >> $R/log.txt
snap; cat $R/log.txt
