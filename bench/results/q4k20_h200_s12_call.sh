#!/usr/bin/env bash
# Session 12, q4k20 (H200, carry [".whl", ".xfer/q4k20"], run from .xfer/q4k20): the tiled Q4_K GEMV's split-K
# ranges on the warps of one program (GemvConfig.warps_k, q4_k_pair.kstep) against the split-K launch with its
# in-launch fold, and a sweep of the split by hand, at the mid decode shapes; the GPU tests of the touched files.
# Results: $OUT/res.tgz (+ $OUT/log.txt).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/clocks.txt 2>&1
SH=4096x14336,6144x4096,4096x2048,2048x4096,5120x2048
P=pairx:4/1/2
ROWS="Q4T@$P/e,Q4T@$P/en,Q4T@$P/ew/2,Q4T@$P/ew/4,Q4T@$P/ew/8,Q4T@pairx:4/1/4/ew/4,Q4T@$P/e/1,Q4T@$P/e/2,Q4T@$P/e/4"
ROWS="$ROWS,Q4T@$P/e/8,Q4T@$P/ew,Q4T@$P/e/0"
B="python3 bench/gemv_tiles_bench.py --types Q4T --qx --no-act-quant --shapes $SH"
# compile the sweep's kernels (CPU) while the GPU tests run
SPARKD_PDL=off timeout 80 $B --defaults-only --rows "$ROWS" --consumer Q4T@default --compile-only --compile-workers 10 \
  > $R/compile.log 2>&1 & C=$!
E=tests/engine
G=("$E/test_gemv_split.py $E/test_split_fold.py"
   "$E/test_q4_k_tiled.py $E/test_fused_qkv.py"
   "$E/test_norm_fold.py"
   "$E/test_pdl.py -k \"not decode_bits\"")
PS=()
for i in "${!G[@]}"; do
  eval timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE ${G[$i]} > $R/tests_$((i+1)).log 2>&1 & PS+=($!)
done
for i in "${!PS[@]}"; do wait ${PS[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/tests_$((i+1)).log)"; done
wait $C; log "compile rc $? $(tail -1 $R/compile.log)"; snap
SPARKD_PDL=off timeout 65 $B --defaults-only --rows "$ROWS" --consumer Q4T@default --json $R/gemv.json > $R/gemv.log 2>&1
log "gemv rc $?"; snap
timeout 30 python3 bench/gemv_tiles_bench.py --types Q4T --qx --no-act-quant --shapes 4096x14336,6144x4096,5120x2048 \
  --pdl --prefetch small --rows "Q4T@$P/e" --compile-workers 8 --json $R/pdl.json > $R/pdl.log 2>&1
log "pdl rc $?"; snap
