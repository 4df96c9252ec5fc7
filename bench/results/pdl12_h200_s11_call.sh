#!/usr/bin/env bash
# Session 11 (branch pdl12) measuring call: the gated weight prefetch (SPARKD_PDL_PREFETCH small / ramp) and
# the split rule "wave2" (SPARKD_GEMV_SPLIT) side by side. H200, run from .xfer/pdl12 with carry
# [".whl", ".xfer/pdl12"]. In the background from the start: the 12-layer Qwen3-30B-A3B-shaped Q4_K and Q8_0
# models. The tests (test_pdl.py, test_gemv_split.py, test_switches.py whole, in 3 processes beside the model
# making), then (a) the GEMV bench, prefetch off / small / ramp, PDL off and on; (b) the split by
# hand at the small shapes; (c) the decode of both models, modes interleaved 3 rounds.
# Ran at commit cee859b (branch pdl12), where SPARKD_PDL_PREFETCH also had "ramp" (a program's first 2 KB)
# and SPARKD_GEMV_SPLIT "wave2" (ranges of 8 groups); neither paid, both were taken out after (docs/performance.md).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
left() { echo $(( ${BUDGET:-150} - ($(date +%s) - T0) )); }
snap() { cp $R/log.txt $OUT/log.txt; tar czf $OUT/res.tgz -C /tmp res; }  # what is measured survives a timeout
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet --layers 12 && mv $1.part $1; }; }
log "$(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' 2>&1)"
mk /tmp/q30-12l-Q4_K.gguf Q4_K > $R/make_q4k.log 2>&1 &
mk /tmp/q30-12l-Q8_0.gguf Q8_0 > $R/make_q80.log 2>&1 &
P=()  # (test_pdl's tiny decode bits with PDL off/on: the default path is unchanged, left out for time)
for t in test_pdl test_gemv_split test_switches; do
  timeout 50 python3 -m pytest -q -p no:cacheprovider -rfE -k "not decode_bits" tests/engine/$t.py > $R/$t.log 2>&1 &
  P+=($!)
done
wait ${P[@]}
for t in test_pdl test_gemv_split test_switches; do log "$t: $(tail -1 $R/$t.log)"; done; snap
timeout 40 python3 bench/gemv_tiles_bench.py --types Q4T,Q8_0P \
  --shapes 4096x2048,5120x2048,2048x4096,6144x4096,4096x14336,14336x4096 --prefetch off,small,ramp \
  --qx --no-act-quant --compile-workers 12 --json $R/gemv.json > $R/gemv.log 2>&1
log "gemv rc $?"; snap
timeout 20 python3 bench/gemv_tiles_bench.py --types Q4T,Q8_0P --shapes 4096x2048,5120x2048,2048x4096,4096x4096 \
  --prefetch off --rows Q4T@pairx:4/1/2/e/1,Q4T@pairx:4/1/2/e/2,Q4T@pairx:4/1/2/e/4,Q8_0P@2/1/4/e/2 \
  --qx --no-act-quant --compile-workers 12 --json $R/split.json > $R/split.log 2>&1
log "split sweep rc $?"; snap
for q in Q4_K Q8_0; do
  MODES=off,small,ramp; [ $q = Q4_K ] && MODES=off,small,ramp,off/wave2,small/wave2  # (Q8_0P: split 1 by its tile)
  for i in $(seq 30); do [ -f /tmp/q30-12l-$q.gguf ] && break; sleep 1; done
  log "model $q $(ls -la /tmp/q30-12l-$q.gguf 2>&1 | awk '{print $5}')"
  T=$(left); [ $q = Q4_K ] && T=$((T - 20)); [ $T -lt 15 ] && { log "decode $q left out ($T s left)"; continue; }
  PYTHONPATH=$PYTHONPATH:$PWD/bench/gpu_box timeout $T python3 bench/gpu_box/pdl_decode.py --quant $q --layers 12 \
    --tokens 256 --forced 32 --prefetch $MODES --repeats 3 --json $R/decode_$q.json > $R/decode_$q.log 2>&1
  log "decode $q rc $? (timeout $T) $(tail -1 $R/decode_$q.log)"; snap
done
snap
