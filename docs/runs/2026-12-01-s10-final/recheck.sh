#!/usr/bin/env bash
# Session 10's last GPU check (H200, carry [".whl"]), on main after the last merges (q6t10, glue10, router10
# and the lead's test fixes): the GPU tests of every file they touched, plus the three that failed in
# call.sh's PART=tests. Results: $OUT/log.txt + $OUT/res.tgz.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
E=tests/engine
t() { timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE "$@"; }
P=()
t $E/test_kernels.py -k "prefill or grouped or int8 or expert_tiles or moe_decode_matches" > $R/gpu_1.log 2>&1 & P+=($!)
t $E/test_fused_kernels.py > $R/gpu_2.log 2>&1 & P+=($!)
t $E/test_row_tiles.py $E/test_eager_decode.py > $R/gpu_3.log 2>&1 & P+=($!)
t $E/test_kernel_engine.py $E/test_moe_decode_fusion.py $E/test_moe_tiled.py > $R/gpu_4.log 2>&1 & P+=($!)
for i in "${!P[@]}"; do wait ${P[$i]}; log "group $((i+1)) rc $? $(tail -1 $R/gpu_$((i+1)).log)"; done
grep -h "^FAILED" $R/*.log | tee -a $OUT/log.txt
tar czf $OUT/res.tgz -C /tmp res
