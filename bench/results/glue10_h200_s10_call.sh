#!/usr/bin/env bash
# Session 10 glue10's device call (H200, cold box; carry [".whl", ".xfer/glue10"], run from .xfer/glue10):
# moe_prefill's glue (SPARKD_MOE_PREFILL_GLUE torch vs kernels) timed with the GEMMs stubbed
# (bench/moe_glue_bench.py), the GPU tests of the grouped prefill, then prefill_bench's ways int8 (the
# new glue) and tglue (int8 with the torch glue: lead10's int8) interleaved on the 12-layer Q8_0 model and a
# 4-layer Q4_K one (the budget: 200 s with the start), both profiled at 512 tokens.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
left() { echo $(( ${BUDGET:-128} - ($(date +%s) - T0) )); }
mk() { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet --layers $3 && mv $1.part $1; }
Q8=$W/q3-12-Q8_0.gguf; Q4=$W/q3-4-Q4_K.gguf
(mk $Q8 Q8_0 12) > $R/make_q8.log 2>&1 &
(mk $Q4 Q4_K 4) > $R/make_q4.log 2>&1 &
(nice -n 5 timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_kernels.py \
   -k "prefill or grouped or int8 or expert_tiles" > $R/gpu_tests.log 2>&1; log "tests: $(tail -1 $R/gpu_tests.log)") & P=$!
log start
timeout 30 python3 bench/moe_glue_bench.py --tokens 512,2048 --calls 100 > $R/glue.log 2>&1
log "glue rc $?: $(grep -E '^ *[0-9]+ (torch|kernels)' $R/glue.log | tr -s ' ' | tr '\n' ';')"
while [ ! -f $Q8 ] && [ $(left) -gt 40 ]; do sleep 1; done
wait $P
log "models: $(ls $W)"
for m in $Q8 $Q4; do
  [ -f $m ] || continue
  t=$(( $(left) - 2 )); [ $m = $Q8 ] && [ -f $Q4 ] && t=$(( t * 3 / 5 ))
  [ $t -gt 10 ] || break
  q=$(basename $m .gguf)
  (cd bench/gpu_box && timeout $t python3 prefill_bench.py --model $m --json $R/prefill_$q.json --tokens 512,2048 \
     --variants tglue,int8,tglue,int8 --profile tglue,int8 --top 12) > $R/prefill_$q.log 2>&1
  log "prefill $q rc $? (limit $t s): $(grep -E ' tokens:|profile' $R/prefill_$q.log | tr -s ' ' | tr '\n' ';')"
done
log done
cp $R/log.txt $OUT/; cd /tmp && tar czf $OUT/res.tgz res
