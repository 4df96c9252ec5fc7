#!/usr/bin/env bash
# Session 13 down13's call (H200, cold box; carry [".whl", ".cache", ".xfer/down13"]; run from .xfer/down13): the
# resident Q4_K MoE down's layout below width 4096 in the 12-layer 2048-wide Qwen3-30B-A3B-shaped Q4_K model,
# SPARKD_MOE_DOWN_LAYOUT=tiled (GGUF blocks below 4096, the default) vs all (pairx bytes at every width), a process
# each, interleaved, 2 rounds: the resident decode (cli generate --resident --cuda-graphs on, 128 tokens, as
# cuda_side_by_side.sh's engine_gen; under `all` also SPARKD_MOE_DOWN_LAUNCH=start, time allowing) and the prompt
# (prefill_bench.py --variants int8,graphs at 128/512/1024/2048). llama.cpp's CUDA build (BUILD_ONLY=1) runs in the
# background from the start; llama-bench -p 128,512,1024,2048 -n 0 and -p 0 -n 128 on the same GGUF at the end if
# it is ready in time. GPU tests of the tiled down first, beside the model's writing.
# As run (commit cd27b95 + this script): END_S=212; the prompt's second round and llama-bench were cut for time (the build
# reached 154 of 279 steps): bench/results/down13_h200_s13_call_log.txt, docs/performance.md.
# Results: $OUT/res.tgz (+ $OUT/log.txt; llama-bench packed in $OUT/llama_bench.tgz.* if it was built).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); END=${END_S:-218}; left() { echo $(( END - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
snap() { cp $R/log.txt $OUT/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
M=$W/q3-12-Q4_K.gguf
OUT=/tmp/bo BUILD_ONLY=1 SDIST=$PWD/../../.cache/llama_cpp_python-0.3.36.tar.gz bash bench/gpu_box/cuda_side_by_side.sh \
  > $R/build.log 2>&1 &
( [ -f $M ] || { timeout 90 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K \
  --quiet --layers 12 && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!
E=tests/engine
G=("$E/test_moe_tiled.py"
   "$E/test_kernel_engine.py -k 'tiled_q4_k_expert or down_layout'"
   "$E/test_kernels.py -k q4k_gemm_launches")
P=()
for i in "${!G[@]}"; do
  eval timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE ${G[$i]} > $R/gpu_tests_$((i+1)).log 2>&1 & P+=($!)
done
wait $MK; log "model rc $? $(ls -la $M 2>&1 | awk '{print $5}')"
for i in "${!P[@]}"; do wait ${P[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/gpu_tests_$((i+1)).log)"; done
grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $R/log.txt; snap
dec() {  # tag layout launch
  [ $(left) -gt 25 ] || { log "dec $1 skipped (time)"; return; }
  SPARKD_MOE_DOWN_LAYOUT=$2 SPARKD_MOE_DOWN_LAUNCH=$3 timeout 40 python3 -m sparkd.engine.cli generate $M \
    --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda --json --cuda-graphs on --resident > $R/dec_$1.json 2> $R/dec_$1.err
  log "decode $1 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/dec_$1.json)"
}
pre() {  # tag layout
  [ $(left) -gt 30 ] || { log "prefill $1 skipped (time)"; return; }
  (cd bench/gpu_box && SPARKD_MOE_DOWN_LAYOUT=$2 timeout 50 python3 prefill_bench.py --model $M --tokens 128,512,1024,2048 \
    --repeats 3 --variants int8,graphs --profile "" --json $R/pre_$1.json) > $R/pre_$1.log 2>&1
  log "prefill $1 rc $?: $(grep -E '^graphs +(128|512|1024|2048) tokens' $R/pre_$1.log | awk '{print $2 ":" $4}' | tr '\n' ' ')"
}
for r in 1 2; do
  dec tiled_$r tiled auto; dec all_$r all auto; pre tiled_$r tiled; pre all_$r all
  [ $(left) -gt 70 ] && dec all-start_$r all start
  snap
done
LB=$W/llama-cuda/llama-bench
if [ -x $LB ] && [ $(left) -gt 8 ]; then
  timeout $(( $(left) - 3 )) $LB -m $M -ngl 99 -p 128,512,1024,2048 -n 0 -r 2 -o json > $R/llama_pp.json 2> $R/llama_pp.err
  log "llama pp rc $?: $(grep avg_ts $R/llama_pp.json | tr -s ' ' | tr '\n' ' ')"
  [ $(left) -gt 5 ] && timeout $(( $(left) )) $LB -m $M -ngl 99 -p 0 -n 128 -r 2 -o json > $R/llama_tg.json 2> $R/llama_tg.err
  log "llama tg rc $?: $(grep avg_ts $R/llama_tg.json | tr -s ' ' | tr '\n' ' ')"
  snap  # the binary for a later call's carry (a file back is at most 16 MiB)
  (cd $W/llama-cuda && strip -o /tmp/llama-bench llama-bench 2>/dev/null || cp llama-bench /tmp/llama-bench
   tar czf - -C /tmp llama-bench | split -b 15M - $OUT/llama_bench.tgz.)
else
  log "no llama-bench in time: $(cat $W/llama_build_seconds.txt 2>/dev/null) $(tail -2 $W/llama_build.txt 2>/dev/null | tr '\n' ' ')"
fi
cp $W/llama_build*.txt $R/ 2>/dev/null
log done; snap
