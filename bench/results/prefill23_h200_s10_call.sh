#!/usr/bin/env bash
# Session 10 prefill23's one call (H200, cold box; carry [".whl", ".xfer/prefill23"], run from
# .xfer/prefill23): the prefill's host side and the MoE tiles. The 12-layer Q8_0 model made in the
# background while the GPU tests of the touched files run (niced); then, quiet, prefill_bench at 512
# and 2048 tokens: s9 (session 9's int8: the slots' sync a layer, a launch per stacked part, 16-row
# expert tiles) -> nosync -> stack (one launch a stack, 16-row tiles) -> t32 -> t64 (the default now),
# each compared with s9's logits (the same bits claimed: 0.0), the default's profile at 512 tokens.
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
E=tests/engine
(nice -n 8 timeout 90 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE $E/test_kernels.py \
   -k "grouped or prefill or int8 or expert_tiles" > $R/gpu_tests_1.log 2>&1) & P1=$!
(nice -n 8 timeout 90 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE $E/test_kernel_engine.py \
   -k "kernel_path or last_token" > $R/gpu_tests_2.log 2>&1
 nice -n 8 timeout 40 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE $E/test_fused_qkv.py \
   > $R/gpu_tests_3.log 2>&1) & P2=$!
log start
wait $P1; log "tests 1 rc $?: $(tail -1 $R/gpu_tests_1.log)"
wait $P2; for i in 2 3; do log "tests $i: $(tail -1 $R/gpu_tests_$i.log)"; done
while [ ! -f $M ]; do sleep 1; [ $(( $(date +%s) - T0 )) -gt 100 ] && break; done
log "model: $(ls -la $M 2>&1)"
(cd bench/gpu_box && timeout 80 python3 prefill_bench.py --model $M --json $R/prefill_Q8_0.json --tokens 512,2048 \
   --variants s9,nosync,stack,t32,t64 --profile int8 --top 14) > $R/prefill_Q8_0.log 2>&1
log "prefill rc $?: $(grep -E ' tokens:|profile' $R/prefill_Q8_0.log | tr -s ' ' | tr '\n' ';')"
log done
cp $R/log.txt $OUT/; cd /tmp && tar czf $OUT/res.tgz res
