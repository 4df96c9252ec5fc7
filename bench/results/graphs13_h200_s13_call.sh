#!/usr/bin/env bash
# graphs13 (session 13): continued prompt graphs on the H200 in one call. The 12-layer qwen3-30b-a3b
# Q8_0 test model made in the background (as prefix13's call) while the gpu-marked tests run
# (test_cuda_graphs.py: the continued graph replays the padded forward's bits; test_prompt_cache.py:
# turn 2 through a continued graph gives --prompt-cache off's tokens; test_device_argmax.py: repeated
# requests through Engine.generate), then bench/gpu_box/prompt_cache_bench.py: turn 2's first-token
# time continued by a graph / continued eagerly (before) / the whole prompt, turn 2 of 80, 200, 624
# and 1648 tokens. Results: $OUT/res.tgz.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
R=/tmp/res; mkdir -p $R; M=/tmp/q3-12-Q8_0.gguf
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
snap() { tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
(timeout 75 python3 -m sparkd.engine.cli make-model $M --preset qwen3-30b-a3b --quant Q8_0 --quiet --layers 12) > $R/make.log 2>&1 & MK=$!
timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE -s tests/engine/test_cuda_graphs.py \
  tests/engine/test_prompt_cache.py tests/engine/test_device_argmax.py > $R/gpu_tests.log 2>&1
log "gpu tests rc $? $(tail -1 $R/gpu_tests.log)"; grep -h "^FAILED\|^ERROR" $R/gpu_tests.log | tee -a $R/log.txt; snap
wait $MK; log "model rc $? $(ls -la $M 2>&1 | awk '{print $5}')"
timeout 95 python3 bench/gpu_box/prompt_cache_bench.py --model $M --turn1 48:16:16,88,512,1536 --reps 4 \
  --json $R/prompt_cache.json > $R/bench.log 2>&1
log "bench rc $?"; grep "turn 1\|prompt graphs" $R/bench.log >> $R/log.txt; tail -3 $R/bench.log >> $R/log.txt
snap; cat $R/log.txt
