#!/usr/bin/env bash
# Session 11's re-check (H200, carry [".whl"]) after the final call's 10 GPU failures (every one the weight
# prefetch's compile at a one-row GEMV: N of 1 comes as a Python int): the two failing tests' files' GPU
# cases, test_pdl.py, and the GEMV-touching files. Results: $OUT/log.txt + $OUT/res.tgz.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
E=tests/engine
t() { timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE "$@"; }
P=()
t $E/test_kernels.py -k "gemv" > $R/gpu_1.log 2>&1 & P+=($!)
t $E/test_q6_k_int.py > $R/gpu_2.log 2>&1 & P+=($!)
t $E/test_pdl.py $E/test_gemv_split.py > $R/gpu_3.log 2>&1 & P+=($!)
t $E/test_int_kernels.py $E/test_fused_qkv.py > $R/gpu_4.log 2>&1 & P+=($!)
for i in "${!P[@]}"; do wait ${P[$i]}; log "group $((i+1)) rc $? $(tail -1 $R/gpu_$((i+1)).log)"; done
grep -h "^FAILED\|^ERROR" $R/*.log | tee -a $OUT/log.txt
tar czf $OUT/res.tgz -C /tmp res
