#!/usr/bin/env bash
# Session 12, q4k21's one call (H200, cold box; carry [".whl", ".xfer/q4k21"], run from .xfer/q4k21):
# 1. the dense pairx integer GEMM (IGEMM_TILES[("Q4_K_TILED", False)]: iblock) against kblock / wblock at 0, 128 and 168
#    registers, at the 12-layer Qwen3-30B-A3B Q4_K model's attention shapes (fused qkv 5120x2048, o 2048x4096), 512
#    and 2048 tokens (igemm_bench: every way's bits against s12's);
# 2. the warps_k GEMV's in-program fold with one exchange (q4_k_pair.kstep, tl.split) against q4k20's KW masked
#    reductions (q4t_twins "kmasked"), the split-K launch and it without its fold, at five shapes.
# Phase 1: the GPU tests (6 processes) and both benches' compiles in parallel; phase 2: the tests stopped (SIGSTOP
# on their process groups), the benches timed alone on the GPU; phase 3: the tests go on until END_S.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); left() { echo $(( ${END_S:-115} - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
snap() { tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
E=tests/engine
P=()
run_t() {  # a test group in its own process group (setsid: $! is the group, for SIGSTOP / SIGCONT)
  local i=$1; shift
  setsid nice -n 5 timeout 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE "$@" > $R/gpu_tests_$i.log 2>&1 &
  P+=($!)
}
run_t 1 $E/test_gemv_split.py
run_t 2 $E/test_q4_k_tiled.py
run_t 3 $E/test_pdl.py
run_t 4 $E/test_kernels.py -k int8_gemm_is
run_t 5 $E/test_kernels.py -k igemm_steps
run_t 6 $E/test_kernels.py -k "int8_gemm_runs or int8_moe_prefill"
Q=pairx:4/1/2
ROWS="Q4T@$Q/e,Q4T@$Q/en,Q4T@kmasked:4/1/2/ew"
GB="python3 bench/gemv_tiles_bench.py --types Q4T --qx --no-act-quant --defaults-only --rows $ROWS \
  --shapes 4096x14336,6144x4096,4096x2048,5120x2048,14336x4096"
SPARKD_PDL=off timeout 60 $GB --compile-only --compile-workers 6 > $R/gemv_compile.log 2>&1 & C=($!)
WAYS=(s12,64/32/4/1/2/0/128,64/32/4/1/2/0/168 64/32/4/1/2/1,64/32/4/1/2/1/128,64/32/4/1/2/1/168
      64/32/4/1/2/2,64/32/4/1/2/2/128,64/32/4/1/2/2/168 64/64/4/1/2/2,64/64/4/1/2/2/168,64/64/8/1/2/2)
IB="python3 igemm_bench.py --types Q4T --grouped '' --shapes 5120x2048,2048x4096"
for w in "${WAYS[@]}"; do
  (cd bench && eval timeout 60 $IB --tokens 512 --ways $w --repeats 1 > $R/igemm_warm_${#C[@]}.log 2>&1) & C+=($!)
done
for p in "${C[@]}"; do wait $p; done
log "compiled: $(tail -1 $R/gemv_compile.log) / igemm warm rows $(cat $R/igemm_warm_*.log | grep -c bits)"
for p in "${P[@]}"; do kill -STOP -- -$p 2>/dev/null; done; log "tests stopped"
SPARKD_PDL=off timeout 25 $GB --json $R/gemv.json > $R/gemv.log 2>&1; log "gemv rc $?"
ALL=$(IFS=,; echo "${WAYS[*]}")
(cd bench && eval timeout 25 $IB --tokens 512,2048 --ways $ALL --repeats 20 --json $R/igemm.json > $R/igemm.log 2>&1)
log "igemm rc $?"
SPARKD_PDL=off timeout 15 $GB --json $R/gemv2.json > $R/gemv2.log 2>&1; log "gemv2 rc $?"; snap
for p in "${P[@]}"; do kill -CONT -- -$p 2>/dev/null; done; log "tests go on"
for i in "${!P[@]}"; do
  t=$(left); [ $t -lt 1 ] && t=1
  timeout $t tail --pid=${P[$i]} -f /dev/null; log "tests $((i+1)): $(tail -1 $R/gpu_tests_$((i+1)).log)"
done
for p in "${P[@]}"; do kill -- -$p 2>/dev/null; done
grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $R/log.txt
log done; snap
