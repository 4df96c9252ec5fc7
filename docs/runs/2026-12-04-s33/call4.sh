#!/usr/bin/env bash
# Session 33, call 4 (H200, carry [".whl", ".cache"]): the DeepSeek-V4-Flash- and Kimi-K3-shaped resident decodes
# through CUDA graphs against llama-bench built with CUDA from the vendored source (cuda_side_by_side.sh
# BUILD_ONLY=1), the same files, at depth 0 and after 2000 tokens. Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
W=/var/tmp/sparkd-cuda; mkdir -p $W
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
OUT=$R/llama WORK=$W BUILD_ONLY=1 bash bench/gpu_box/cuda_side_by_side.sh > $R/llama_build.log 2>&1 & LB=$!
D=/var/tmp/deepseek-v4-flash-5l-16e-Q4_K.gguf
K=/var/tmp/kimi-k3-5l-32e-Q4_K.gguf
[ -f $D ] || python3 -m sparkd.engine.cli make-model $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --quiet
[ -f $K ] || python3 -m sparkd.engine.cli make-model $K --preset kimi-k3 --experts 32 --layers 5 --quant Q4_K --quiet
wait $LB
log "llama build: $(tail -2 $R/llama_build.log | tr '\n' ' ')"
snap
L=$W/llama-cuda/llama-bench
for m in D K; do
  f=${!m}
  timeout 120 $L -o json -m $f -ngl 99 -p 0 -n 128 -d 0,2000 -r 2 > $R/llama_$m.json 2> $R/llama_$m.err
  log "llama-bench $m rc $?: $(grep -o '"n_depth": [0-9]*\|"avg_ts": [0-9.e+]*' $R/llama_$m.json | tr '\n' ' ')"
  snap
done
gen() {  # tag model [flags...]
  local tag=$1 m=$2; shift 2
  timeout 150 python3 -m sparkd.engine.cli generate $m --device cuda --json "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$tag.json) $(grep -o '"prompt_tok_s": [0-9.]*' $R/gen_$tag.json)"
}
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
for r in 1 2; do
  gen dsv4_$r $D --resident --tokens 1,2,3,4,5,6,7,8 -n 128
  gen k3_$r $K --resident --tokens 1,2,3,4,5,6,7,8 -n 128
done
gen dsv4_long $D --resident --tokens $LT -n 128 --ctx 4096
gen k3_long $K --resident --tokens $LT -n 128 --ctx 4096
snap
