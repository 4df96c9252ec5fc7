#!/usr/bin/env bash
# Session 11 attn11's device call (H200, cold box; carry [".whl", ".xfer/attn11"], run from .xfer/attn11):
# the prompt's row-wise attention (kernels/prefill_attention) and float GEMM (kernels/float_gemm) against
# torch / cuBLAS. GPU tests (the kernels vs torch, padded rows bit for bit; prompt graphs == eager prompt,
# bit for bit, under both switches' ways; graphs on/off tokens) while the 12-layer Q4_K and Q8_0 models are
# made; the attention and the gate alone at the model's shape; prompt_pad_diff at 600 tokens before/after;
# prefill_bench's ways int8-torch/int8-rows (eager) and graphs-torch/graphs-rows interleaved at 40, 128, 512,
# 600, 1024 tokens with padded-vs-eager bits, both eager ways profiled at 512. Budget ~180 s after the start.
# (Run while the kernels were the default, as int8/graphs: the logs and JSON name the -rows ways so.)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
left() { echo $(( ${BUDGET:-178} - ($(date +%s) - T0) )); }
mk() { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet --layers 12 && mv $1.part $1; }
Q4=$W/q3-12-Q4_K.gguf; Q8=$W/q3-12-Q8_0.gguf
(mk $Q4 Q4_K) > $R/make_q4.log 2>&1 &
(mk $Q8 Q8_0) > $R/make_q8.log 2>&1 &
log start
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_fused_kernels.py tests/engine/test_cuda_graphs.py \
  -k "prefill_attention or float_gemm or prompt_graph" > $R/gpu_tests_1.log 2>&1 & P=$!
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_cuda_graphs.py -k "with_and_without_graphs" > $R/gpu_tests_2.log 2>&1
log "tests 2 rc $?: $(tail -1 $R/gpu_tests_2.log)"
wait $P; log "tests 1 rc $?: $(tail -1 $R/gpu_tests_1.log)"
timeout 25 python3 bench/gpu_box/prefill_attention_bench.py --tokens 40,128,512,600,1000,1024 --json $R/attn_bench.json > $R/attn_bench.log 2>&1
log "attention bench rc $?"; cat $R/attn_bench.log | tee -a $R/log.txt
while [ ! -f $Q8 ] && [ $(left) -gt 60 ]; do sleep 1; done
if [ -f $Q8 ]; then
  for way in torch kernel; do
    (cd bench/gpu_box && SPARKD_PREFILL_ATTENTION=$way SPARKD_PREFILL_FLOAT_GEMM=$way timeout 30 python3 prompt_pad_diff.py \
       --model $Q8 --quant Q8_0 --tokens 600 --json $R/pad_diff_$way.json) > $R/pad_diff_$way.log 2>&1 &
  done
  wait; log "pad diff: $(grep -h tokens $R/pad_diff_*.log | tr '\n' ';')"
fi
for m in $Q4 $Q8; do
  while [ ! -f $m ] && [ $(left) -gt 30 ]; do sleep 1; done
  [ -f $m ] || { log "no $m"; continue; }
  t=$(( $(left) - 2 )); [ $m = $Q4 ] && t=$(( t * 11 / 20 ))
  [ $t -gt 15 ] || break
  q=$(basename $m .gguf)
  (cd bench/gpu_box && timeout $t python3 prefill_bench.py --model $m --json $R/prefill_$q.json --tokens 40,128,512,600,1024 \
     --variants int8-torch,int8-rows,graphs-torch,graphs-rows,graphs-torch,graphs-rows --profile int8-torch,int8-rows --top 10) > $R/prefill_$q.log 2>&1
  log "prefill $q rc $? (limit $t s): $(grep -E ' tokens:|profile' $R/prefill_$q.log | tr -s ' ' | tr '\n' ';')"
done
log done
cp $R/log.txt $OUT/; cd /tmp && tar czf $OUT/res.tgz res
