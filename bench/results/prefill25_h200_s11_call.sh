#!/usr/bin/env bash
# Session 11 prefill25's call (H200, cold box; carry [".whl", ".xfer/prefill25"], run from .xfer/prefill25): the
# integer prefill GEMMs (SPARKD_IGEMM s10 vs s11). In the background: the two 12-layer models, igemm_bench's
# kernels compiled by a first untimed pass (one process a type, Triton's disk cache), the GPU tests (niced).
# Then on a quiet GPU, one at a time: igemm_bench (every way side by side, dense 2048x2048 and the MoE shapes,
# 512 and 2048 tokens) and prefill_bench (s10g vs int8 interleaved, 512 and 2048 tokens, both profiled).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
left() { local l=$(( 200 - ($(date +%s) - T0) )); [ $l -lt $1 ] && echo $(( l > 1 ? l : 1 )) || echo $1; }  # cap by 200 s
mk() { [ -f $1 ] || { timeout 110 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 \
  --quiet --layers 12 && mv $1.part $1; }; }
(mk $W/q3-12-Q4_K.gguf Q4_K) > $R/make4.log 2>&1 & M1=$!
(mk $W/q3-12-Q8_0.gguf Q8_0) > $R/make8.log 2>&1 & M2=$!
WAYS=s10,s11,64/32/4/4/2/1,64/32/4/4/3/1,64/32/4/8/3/1,64/32/4/2/4/1,128/32/8/4/2/1,64/32/8/4/3/1,32/32/4/4/2/1,64/32/4/4/2/0,64/64/4/4/2/1
B="python3 igemm_bench.py --shapes 2048x2048 --grouped 768x2048,2048x768 --tokens 512,2048 --ways $WAYS"
for t in Q4T Q8_0 Q4_K Q6_K; do (cd bench && timeout 100 $B --types $t --repeats 1 > $R/warm_$t.log 2>&1) & done
P="nice -n 8 timeout 100 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE"
$P tests/engine/test_kernels.py -k "int8 or grouped or prefill" > $R/gpu_tests_1.log 2>&1 & T1=$!
$P tests/engine/test_q4_k_tiled.py tests/engine/test_row_tiles.py tests/engine/test_moe_tiled.py tests/engine/test_fused_qkv.py \
   > $R/gpu_tests_2.log 2>&1 & T2=$!
$P tests/engine/test_kernel_engine.py -k "kernel_path or last_token" > $R/gpu_tests_3.log 2>&1 & T3=$!
log start
for j in $(jobs -p); do [ $j = $M1 ] || [ $j = $M2 ] || wait $j; done
log "warm + tests done: $(tail -qn1 $R/gpu_tests_*.log | tr '\n' ';')"
(cd bench && timeout $(left 45) $B --types Q4T,Q8_0,Q4_K,Q6_K --grouped-types Q4T,Q8_0,Q4_K --repeats 10 --json $R/igemm.json \
  > $R/igemm.log 2>&1); log "igemm rc $?"
wait $M1 $M2; log "models: $(ls -la $W/*.gguf | awk '{print $5}' | tr '\n' ' ')"
for q in Q4_K Q8_0; do
  (cd bench/gpu_box && timeout $(left 55) python3 prefill_bench.py --model $W/q3-12-$q.gguf --tokens 512,2048 \
     --variants s10g,int8,s10g,int8 --profile s10g,int8 --json $R/prefill_$q.json) > $R/prefill_$q.log 2>&1
  log "prefill $q rc $?: $(grep -E 'tokens:|profile|igemm' $R/prefill_$q.log | tr -s ' ' | tr '\n' ';')"
done
log done
cd /tmp && tar czf $OUT/res.tgz res; cp $R/log.txt $OUT/
