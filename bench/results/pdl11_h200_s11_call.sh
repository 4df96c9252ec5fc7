#!/usr/bin/env bash
# Session 11 (branch pdl11) measuring call: the dense integer GEMV's weight prefetch before the PDL wait
# (SPARKD_PDL_PREFETCH off / lines / bulk), side by side. H200, run from .xfer/pdl11 with carry
# [".whl", ".xfer/pdl11"]. In the background from the start: the 12-layer Qwen3-30B-A3B-shaped Q4_K and Q8_0
# models. Then tests/engine/test_pdl.py whole (PTX order on the box's triton, the GPU bits tests), the GEMV
# bench (a: back-to-back launches, b: after the add+norm+quant launch, PDL off/on x prefetch modes, the same-bytes
# copy), the decode step of both models (c: PDL on, prefetch modes interleaved), then if time is left (d) the
# split by hand at 6144x4096 / 4096x2048 with the best prefetch mode of (a).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
left() { echo $(( ${BUDGET:-185} - ($(date +%s) - T0) )); }
snap() { cp $R/log.txt $OUT/log.txt; tar czf $OUT/res.tgz -C /tmp res; }  # what is measured survives a timeout
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet --layers 12 && mv $1.part $1; }; }
log "$(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' 2>&1)"
mk /tmp/q30-12l-Q4_K.gguf Q4_K > $R/make_q4k.log 2>&1 &
mk /tmp/q30-12l-Q8_0.gguf Q8_0 > $R/make_q80.log 2>&1 &
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfE tests/engine/test_pdl.py > $R/test_pdl.log 2>&1
log "test_pdl rc $? $(tail -1 $R/test_pdl.log)"; snap
SHAPES=4096x14336,6144x4096,4096x2048,14336x4096,151936x2048
timeout 90 python3 bench/gemv_tiles_bench.py --types Q4T,Q8_0P --shapes $SHAPES --prefetch off,lines,bulk --producer \
  --qx --no-act-quant --compile-workers 8 --json $R/gemv.json > $R/gemv.log 2>&1
log "gemv rc $?"
BEST=$(python3 - $R/gemv.json <<'PY' 2>> $R/log.txt
import json, math, sys
rows = json.load(open(sys.argv[1]))["rows"]
us = {(r["kernel"], r["type"], r["config"]): r["us"] for r in rows}
score = {}
for m in ("lines", "bulk"):
    ratios = [us[k] / us[(k[0], k[1], "default pdl on prefetch off")] for k in us if k[2] == f"default pdl on prefetch {m}"]
    score[m] = math.exp(sum(map(math.log, ratios)) / len(ratios))
print(min(score, key=score.get))
print(score, file=sys.stderr)
PY
)
log "best prefetch (geo-mean us ratio, pdl on): ${BEST:=bulk}"; snap
for q in Q4_K Q8_0; do
  for i in $(seq 40); do [ -f /tmp/q30-12l-$q.gguf ] && break; sleep 1; done
  log "model $q $(ls -la /tmp/q30-12l-$q.gguf 2>&1 | awk '{print $5}')"
  T=$(left); [ $T -gt 60 ] && T=60; [ $T -lt 20 ] && { log "decode $q left out ($T s left)"; continue; }
  PYTHONPATH=$PYTHONPATH:$PWD/bench/gpu_box timeout $T python3 bench/gpu_box/pdl_decode.py --quant $q --layers 12 \
    --tokens 256 --forced 32 --prefetch off,lines,bulk --repeats 3 --json $R/decode_$q.json > $R/decode_$q.log 2>&1
  log "decode $q rc $? $(tail -1 $R/decode_$q.log)"; snap
done
T=$(left)
if [ $T -gt 25 ]; then
  timeout $T python3 bench/gemv_tiles_bench.py --types Q4T,Q8_0P --shapes 6144x4096,4096x2048 --prefetch off,$BEST \
    --rows Q4T@pairx:4/1/2/e/1,Q4T@pairx:4/1/2/e/2,Q4T@pairx:4/1/2/e/4,Q4T@pairx:4/1/2/e/8,Q8_0P@2/1/4/e/2,Q8_0P@2/1/4/e/4 \
    --qx --no-act-quant --compile-workers 8 --json $R/split.json > $R/split.log 2>&1
  log "split sweep rc $? (timeout $T)"
else
  log "split sweep left out ($T s left)"
fi
snap
