#!/usr/bin/env bash
# Session 13 prefill28's call (H200, cold box; carry [".whl", ".xfer/prefill28"]): where the Q4_K prompt's integer GEMMs
# lose (the 12-layer 2048-wide Q4_K model: MoE gate/up in pairx bytes, down in GGUF Q4_K's, attention pairx).
# Phase 1 (parallel): the model made; igemm_bench's launches compiled (--repeats 1, a process a way);
# test_q4k_gemm_launches_keep_the_bits (every launch tried, 5 processes). Phase 2 (alone on the GPU): igemm_bench timed
# (128 experts, top 8, 512 and 2048 tokens): pairx gate/up 768x2048 and GGUF down 2048x768 at 32-row expert tiles
# (mma.sync) and 64-row ones (M = 64 on 4 warps: Triton's wgmma), pairx's dense qkv 5120x2048 / o 2048x4096; the best
# gate/up + down pair of each tile height (time as a layer runs them: 2 gate/up + 1 down, each length counted alike;
# the best dense launch joined to the better pair when it saves >= 3 %) go to prefill_bench as t:G:N:D:T ways beside
# the default's prompt graphs, interleaved, 128/512/1024/2048 tokens, profiled at 512.
# (No llama.cpp build: its ~180 s does not fit the 240 s budget; the llama.cpp column is session 12's final call.)
# (As run, test_kernels.py's launch list was all 17 launches here (the -k groups below name them); after the call it
# keeps s13's launch and the 64-row ones. The run picked "t:32/32/2/1/2/2/168:64/32/4/1/2/0/168:-:32" and
# "t:32/64/4/1/2/2/168:32/64/4/1/2/0/168:-:64"; s13 took the first's GGUF down launch only: docs/performance.md.)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); left() { echo $(( ${END_S:-168} - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
snap() { tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
M=$W/q3-12-Q4_K.gguf
( [ -f $M ] || { nice -n 10 timeout 60 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K \
  --quiet --layers 12 && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!
P=()
K=("pairx-g64x32 or pairx-g32x32" "pairx-g128 or pairx-g64x64w4s2r168" "pairx-g64x64w4s2r0 or pairx-g64x64w4s2r232 or pairx-g32x64"
   "pairx-d or q4_k-g64x32w4s2" "q4_k-g64x32w4s3 or q4_k-g32x32 or q4_k-g64x32w8" "q4_k-g64x64 or q4_k-g32x64")
for i in "${!K[@]}"; do  # the GPU tests of every launch tried (their bits: the default's), beside the compiles
  nice -n 5 timeout 62 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_kernels.py \
    -k "q4k_gemm_launches and (${K[$i]})" > $R/gpu_tests_$((i+1)).log 2>&1 & P+=($!)
done
GU32="s12,64/32/4/1/3/2/168,32/32/2/1/2/2/168,64/32/8/1/2/2/128,128/32/4/1/2/2/0"
GU64="s12,64/64/4/1/2/2/0,64/64/4/1/2/2/232,32/64/4/1/2/2/168"
DN32="s12,64/32/4/1/2/0/168,64/32/4/1/3/0/168,32/32/2/1/2/0/168,64/32/8/1/2/0/128"
DN64="s12,64/64/4/1/2/0/232,32/64/4/1/2/0/168"
DW="s12,64/64/4/1/2/0/168,64/64/4/1/2/0/0"
GU="python3 igemm_bench.py --types Q4T --shapes '' --grouped-types Q4T --grouped 768x2048"
DN="python3 igemm_bench.py --types Q4_K --shapes '' --grouped-types Q4_K --grouped 2048x768"
DB="python3 igemm_bench.py --types Q4T --grouped '' --shapes 5120x2048,2048x4096"
RUNS=("gu32|$GU|32|$GU32" "gu64|$GU|64|$GU64" "dn32|$DN|32|$DN32" "dn64|$DN|64|$DN64" "dense|$DB|32|$DW")
C=()
for r in "${RUNS[@]}"; do
  IFS='|' read -r name cmd bt ways <<< "$r"
  for w in ${ways//,/ }; do
    (cd bench && eval timeout 58 $cmd --block-t $bt --tokens 512 --ways $w --repeats 1 > $R/warm_${name}_${w//\//_}.log 2>&1) & C+=($!)
  done
done
for p in "${C[@]}"; do wait $p; done; log "igemm compiled: $(grep -h -c 'bits' $R/warm*.log | tr '\n' ' ')"
for i in "${!P[@]}"; do wait ${P[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/gpu_tests_$((i+1)).log)"; done
grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $R/log.txt
wait $MK; log "model rc $? $(ls -la $M 2>&1 | awk '{print $5}')"; snap
for r in "${RUNS[@]}"; do
  IFS='|' read -r name cmd bt ways <<< "$r"
  (cd bench && eval timeout 25 $cmd --block-t $bt --tokens 512,2048 --ways $ways --json $R/igemm_$name.json > $R/igemm_$name.log 2>&1)
  log "igemm $name rc $?"
done; snap
PICK=$(python3 bench/results/prefill28_pick.py $R 2>> $R/log.txt)
log "picked: $PICK"
[ -n "$PICK" ] || PICK="t:-:-:-:64"
V="int8,graphs,$PICK,graphs,$PICK"
L=$(( $(left) - 3 )); [ $L -gt 25 ] || L=25
(cd bench/gpu_box && timeout $L python3 prefill_bench.py --model $M --tokens 128,512,1024,2048 --repeats 3 \
  --variants "$V" --profile "graphs,${PICK%%,*}" --json $R/prefill_Q4_K.json) > $R/prefill_Q4_K.log 2>&1
log "prefill Q4_K rc $?: $(grep -E ' (128|512|1024|2048) tokens|GPU kernels' $R/prefill_Q4_K.log | tr -s ' ' | tr '\n' ';')"
log done; snap
