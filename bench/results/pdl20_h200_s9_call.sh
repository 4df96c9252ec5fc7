#!/usr/bin/env bash
# Session 9 (branch pdl20) measuring call: programmatic dependent launch off vs on, side by side.
# H200, cold box, run from .xfer/pdl20 with carry [".whl", ".xfer/pdl20"]. Meanwhile in the background:
# the 12-layer Qwen3-30B-A3B-shaped Q8_0 model, tests/engine/test_pdl.py whole (its PTX check on the box's
# triton, the decode bits test on the GPU) and the split-K fold's GPU tests (tickets under PDL).
# Then the GEMV bench (default tiles, PDL off / on rows, x pre-quantized), then the decode step.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
python3 - > $R/versions.txt 2>&1 <<'PY'
import dataclasses, torch, triton
from triton.backends.nvidia.compiler import CUDAOptions
import triton.language.extra.cuda as c
print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(),
      torch.cuda.get_device_capability(), "cuda", torch.version.cuda)
print("gdc_wait", hasattr(c, "gdc_wait"), "gdc_launch_dependents", hasattr(c, "gdc_launch_dependents"),
      "launch_pdl option", "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)})
PY
log "$(cat $R/versions.txt | tr '\n' ' ')"
M=/tmp/q30-12l-Q8_0.gguf
(nice -n 10 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q8_0 --layers 12 --quiet \
  && mv $M.part $M) > $R/make.log 2>&1 &
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/engine/test_pdl.py > $R/test_pdl.log 2>&1 & P1=$!
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_split_fold.py > $R/test_fold_gpu.log 2>&1 & P2=$!
timeout 90 python3 bench/gemv_tiles_bench.py --types Q8_0P,Q4T --shapes 151936x2048,14336x4096,4096x14336,6144x4096,4096x2048 \
  --pdl --qx --no-act-quant --compile-workers 8 --json $R/gemv_pdl.json > $R/gemv_pdl.log 2>&1
log "gemv rc $?"
wait $P1; log "test_pdl rc $? $(tail -1 $R/test_pdl.log)"
wait $P2; log "fold gpu tests rc $? $(tail -1 $R/test_fold_gpu.log)"
for i in $(seq 60); do [ -f $M ] && break; sleep 1; done
log "model $(ls -la $M 2>&1 | awk '{print $5}')"
PYTHONPATH=$PYTHONPATH:$PWD/bench/gpu_box timeout 100 python3 bench/gpu_box/pdl_decode.py --quant Q8_0 --layers 12 \
  --tokens 256 --forced 32 --json $R/decode_pdl.json > $R/decode_pdl.log 2>&1
log "decode rc $? $(tail -1 $R/decode_pdl.log)"
tar czf $OUT/res.tgz -C /tmp res
