#!/usr/bin/env bash
# Session 11 prefill24's device call (H200, cold box; carry [".whl", ".xfer/prefill24"], run from
# .xfer/prefill24): the prompt forward as a CUDA graph per length bucket (cuda_graphs.PromptForward).
# The GPU tests of test_cuda_graphs.py (prompt graphs vs eager, bit for bit; the engine and CLI with
# graphs on/off) while the 12-layer Q4_K and Q8_0 models are made, then prefill_bench's ways int8
# (eager, the default before) and graphs interleaved at 40 (bucket 64), 128, 512, 600 (bucket 640) and 2048 tokens,
# both profiled at 512. Budget ~185 s after the start.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
left() { echo $(( ${BUDGET:-182} - ($(date +%s) - T0) )); }
mk() { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet --layers 12 && mv $1.part $1; }
Q4=$W/q3-12-Q4_K.gguf; Q8=$W/q3-12-Q8_0.gguf
(mk $Q4 Q4_K) > $R/make_q4.log 2>&1 &
(mk $Q8 Q8_0) > $R/make_q8.log 2>&1 &
log start
# the prompt graph tests and the rest of the file's GPU tests side by side (nothing timed yet)
timeout 70 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_cuda_graphs.py -k prompt_graph > $R/gpu_tests_1.log 2>&1 & P=$!
timeout 70 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_cuda_graphs.py -k "not prompt_graph" > $R/gpu_tests_2.log 2>&1
log "tests 2 rc $?: $(tail -1 $R/gpu_tests_2.log)"
wait $P; log "tests 1 rc $?: $(tail -1 $R/gpu_tests_1.log)"
for m in $Q4 $Q8; do
  while [ ! -f $m ] && [ $(left) -gt 30 ]; do sleep 1; done
  [ -f $m ] || { log "no $m"; continue; }
  t=$(( $(left) - 2 )); [ $m = $Q4 ] && t=$(( t * 11 / 20 ))
  [ $t -gt 15 ] || break
  q=$(basename $m .gguf)
  (cd bench/gpu_box && timeout $t python3 prefill_bench.py --model $m --json $R/prefill_$q.json --tokens 40,128,512,600,2048 \
     --variants int8,graphs,int8,graphs --profile int8,graphs --top 8) > $R/prefill_$q.log 2>&1
  log "prefill $q rc $? (limit $t s): $(grep -E ' tokens:|profile' $R/prefill_$q.log | tr -s ' ' | tr '\n' ';')"
done
log done
cp $R/log.txt $OUT/; cd /tmp && tar czf $OUT/res.tgz res
