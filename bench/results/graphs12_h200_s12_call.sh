#!/usr/bin/env bash
# Session 12 graphs12's device call (H200, cold box; carry [".whl", ".xfer/graphs12"], run from
# .xfer/graphs12): the prompt graphs made hard to break. The GPU tests of test_cuda_graphs.py (a real
# out-of-memory in a capture falls back to the eager bits and gives the memory back; the free-memory
# margin; --prompt-graphs at load) and test_device_argmax.py while the 12-layer Q8_0 model is made,
# then prompt_graphs_load.py: --prompt-graphs lazy / auto / 64,512,1024 side by side (load time, a new
# bucket's first request and its replay, the pool), and each bucket's graph alone in its own pool.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
left() { echo $(( ${BUDGET:-160} - ($(date +%s) - T0) )); }
Q8=$W/q3-12-Q8_0.gguf
[ -f $Q8 ] || (nice -n 10 timeout 120 python3 -m sparkd.engine.cli make-model $Q8.part --preset qwen3-30b-a3b --quant Q8_0 \
  --quiet --layers 12 && mv $Q8.part $Q8) > $R/make.log 2>&1 &
log start
E=tests/engine
timeout 75 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE $E/test_cuda_graphs.py -k "out_of_memory or margin or at_load" > $R/gpu_tests_new.log 2>&1 & P=$!
timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $E/test_cuda_graphs.py $E/test_device_argmax.py -k "not (out_of_memory or margin or at_load)" > $R/gpu_tests_rest.log 2>&1
log "tests rest rc $?: $(tail -1 $R/gpu_tests_rest.log)"
wait $P; log "tests new rc $?: $(tail -1 $R/gpu_tests_new.log)"
grep -h "failed capture:\|prompt graph stats\|^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $R/log.txt
while [ ! -f $Q8 ] && [ $(left) -gt 40 ]; do sleep 1; done
log "model: $(ls -la $Q8 2>&1 | awk '{print $5}')"
t=$(( $(left) - 3 ))
if [ -f $Q8 ] && [ $t -gt 20 ]; then
  timeout $t python3 bench/gpu_box/prompt_graphs_load.py --model $Q8 --modes "lazy;auto;64,512,1024" \
    --tokens 40,128,200,512,600,1000 --alone 64,128,256,512,1024 --ctx 2048 --json $R/load.json > $R/load.log 2>&1
  log "load bench rc $? (limit $t s)"; cat $R/load.log | grep -v Warning | tee -a $R/log.txt
fi
log done
cp $R/log.txt $OUT/; cd /tmp && tar czf $OUT/res.tgz res
