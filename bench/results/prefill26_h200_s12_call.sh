#!/usr/bin/env bash
# Session 12 prefill26's call (H200, cold box; carry [".whl", ".xfer/prefill26"]): pairx's grouped integer GEMM
# with the 32-bit word unpack (q4_k_pair.wblock) and a 128-register cap against session 11's kblock.
# Phase 1 (parallel): the 12-layer Q4_K model made, the GPU tests of the touched files, igemm_bench's kernels
# compiled (--repeats 1: Triton's cache for phase 2). Phase 2: igemm_bench timed alone on the GPU (Q4T grouped
# gate/up and down, 32- and 64-row expert tiles). Phase 3: prefill_bench 128/512/1024/2048, ways interleaved,
# until END_S (165 s) after the start.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); left() { echo $(( ${END_S:-165} - $(date +%s) + T0 )); }; log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
snap() { tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
M=$W/q3-12-Q4_K.gguf
( [ -f $M ] || { nice -n 10 timeout 100 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K \
  --quiet --layers 12 && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!
E=tests/engine
K="int8_gemm_is or igemm_steps or int8_gemm_runs"
G=("$E/test_kernels.py -k \"$K\"" "$E/test_kernels.py -k \"(int8 or igemm or grouped or prefill or gemm) and not ($K)\""
   "$E/test_int_kernels.py $E/test_moe_tiled.py $E/test_q4_k_tiled.py"
   "$E/test_kernel_engine.py -k \"kernel_path or last_token or prefill\"")
P=()
for i in "${!G[@]}"; do
  eval nice -n 5 timeout 75 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE ${G[$i]} > $R/gpu_tests_$((i+1)).log 2>&1 & P+=($!)
done
WAYS32="s11,s12,64/32/4/1/2/2,64/32/4/1/2/1/128,64/32/4/1/2/2/168"
WAYS64="s11,s12,64/64/8/1/2/2/128,64/64/8/1/2/1,64/64/4/1/2/2/128"
IB="python3 igemm_bench.py --types Q4T --shapes '' --grouped-types Q4T"
C=()
for g in 768x2048 2048x768; do
  (cd bench && eval timeout 65 $IB --grouped $g --tokens 512 --ways $WAYS32 --repeats 1 > $R/warm32_$g.log 2>&1) & C+=($!)
  (cd bench && eval timeout 65 $IB --grouped $g --tokens 2048 --block-t 64 --ways $WAYS64 --repeats 1 > $R/warm64_$g.log 2>&1) & C+=($!)
done
for p in "${C[@]}"; do wait $p; done; log "igemm compiled: $(grep -h -c 'bits' $R/warm*.log | tr '\n' ' ')"
for i in "${!P[@]}"; do wait ${P[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/gpu_tests_$((i+1)).log)"; done
grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $R/log.txt; snap
(cd bench && eval timeout 30 $IB --grouped 768x2048,2048x768 --tokens 512,2048 --ways $WAYS32 --repeats 20 \
  --json $R/igemm32.json > $R/igemm32.log 2>&1); log "igemm32 rc $?"
(cd bench && eval timeout 20 $IB --grouped 768x2048,2048x768 --tokens 2048 --block-t 64 --ways $WAYS64 --repeats 20 \
  --json $R/igemm64.json > $R/igemm64.log 2>&1); log "igemm64 rc $?"; snap
wait $MK; log "model rc $? $(ls -la $M 2>&1 | awk '{print $5}')"
(cd bench/gpu_box && timeout $(left) python3 prefill_bench.py --model $M --tokens 128,512,1024,2048 --repeats 3 \
  --variants s11g,int8,s12w,i64,s11g,int8 --profile s11g,int8 --json $R/prefill_Q4_K.json) > $R/prefill_Q4_K.log 2>&1
log "prefill Q4_K rc $?: $(grep -E ' (128|512|1024|2048) tokens' $R/prefill_Q4_K.log | tr -s ' ' | tr '\n' ';')"
log done; snap
