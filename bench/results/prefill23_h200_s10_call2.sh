#!/usr/bin/env bash
# Session 10 prefill23's second call (H200, cold box; carry [".whl", ".xfer/prefill23"], run from
# .xfer/prefill23). Call 1's ways drifted by more than their differences (host-bound prompts on a box
# whose speed moved between ways): here s9 (session 9's int8, each prompt making its rope table) and
# int8 (the defaults now: no slots' sync, one launch a stack, 32-row expert tiles, the model's caches
# sharing rope tables) interleaved twice at 512 and 2048 tokens, both profiled at 512; the engine's
# GPU tests (kernel path, last token) while the model is made.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
M=$W/q3-12-Q8_0.gguf
(python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q8_0 --quiet --layers 12 \
   && mv $M.part $M) > $R/make.log 2>&1 &
(nice -n 8 timeout 40 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE tests/engine/test_kernel_engine.py \
   -k "kernel_path or last_token" > $R/gpu_tests_2.log 2>&1) & P2=$!
log start
while [ ! -f $M ]; do sleep 1; [ $(( $(date +%s) - T0 )) -gt 45 ] && break; done
wait $P2; log "tests 2: $(tail -1 $R/gpu_tests_2.log)"
log "model: $(ls -la $M 2>&1)"
(cd bench/gpu_box && timeout 55 python3 prefill_bench.py --model $M --json $R/prefill_Q8_0.json --tokens 512,2048 \
   --variants s9,int8,s9,int8 --profile s9,int8 --top 14) > $R/prefill_Q8_0.log 2>&1
log "prefill rc $?: $(grep -E ' tokens:|profile' $R/prefill_Q8_0.log | tr -s ' ' | tr '\n' ';')"
log done
cp $R/log.txt $OUT/; cd /tmp && tar czf $OUT/res.tgz res
