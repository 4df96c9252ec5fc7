#!/usr/bin/env bash
# Session 35, call 3 (H200, a fresh machine: the models and llama-bench built again as in call 1; carry [".whl",
# ".cache"]): after call 2, KernelLinear.dense through kernels/dequantize.py (the identity GEMM cost ~1 and ~15 ms a
# layer's prompt) and SHORT_ROW_TILE for the 128-wide k product; against 4858010 (.cache/old) side by side, prompt and
# decode; llama-bench again; the GPU tests of the touched kernels, layers and graphs. Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res3; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res3; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW
W=/var/tmp/sparkd-cuda; mkdir -p $W
OUT=$R/llama WORK=$W BUILD_ONLY=1 bash bench/gpu_box/cuda_side_by_side.sh > $R/llama_build.log 2>&1 & LB=$!
V=/var/tmp/deepseek-v3-5l-16e-Q4_K.gguf
V8=/var/tmp/deepseek-v3-5l-16e-Q8_0.gguf
K=/var/tmp/kimi-k3-5l-32e-Q4_K.gguf
mk() { [ -f $1 ] || python3 -m sparkd.engine.cli make-model "$@" --quiet; }
mk $V --preset deepseek-v3 --experts 16 --layers 5 --quant Q4_K --tensor-type attn_k_b=Q5_0
mk $V8 --preset deepseek-v3 --experts 16 --layers 5 --quant Q8_0
mk $K --preset kimi-k3 --experts 32 --layers 5 --quant Q4_K --tensor-type attn_k_b=Q5_0
log "models: $(ls -la /var/tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_q5_0_int.py tests/engine/test_mla_prompt.py \
  tests/engine/test_kernels.py tests/engine/test_kernel_engine.py tests/engine/test_cuda_graphs.py \
  -k "Q5_0 or q5_0 or dense_is or dequantize or grouped or integer_sums or mla or deepseek" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
wait $LB
log "llama build: $(tail -2 $R/llama_build.log | tr '\n' ' ')"
snap
timeout 100 python3 bench/gpu_box/mla_heads_bench.py --json $R/mla_heads.json > $R/mla_heads.txt 2>&1
log "mla_heads rc $?"
snap
L=$W/llama-cuda/llama-bench
for m in V V8; do
  f=${!m}
  timeout 100 $L -o json -m $f -ngl 99 -p 0 -n 128 -d 0,2000 -r 2 > $R/llama_$m.json 2> $R/llama_$m.err
  log "llama-bench $m rc $?: $(grep -o '"n_depth": [0-9]*\|"avg_ts": [0-9.e+]*' $R/llama_$m.json | tr '\n' ' ')"
done
snap
gen() {  # tag tree model [args...]; from /tmp: `python3 -m` puts the working directory first on sys.path
  local tag=$1 tree=$2 m=$3; shift 3
  (cd /tmp && PYTHONPATH=/tmp/site:$tree timeout 100 python3 -c "import sparkd; print(sparkd.__file__)" > $R/tree_$tag.txt;
   PYTHONPATH=/tmp/site:$tree timeout 100 python3 -m sparkd.engine.cli generate $m --device cuda --json \
    "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ')"
}
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
for r in 1 2; do
  gen v3_new_$r $NEW $V --resident --tokens 1,2,3,4,5,6,7,8 -n 128
  gen v3_old_$r $OLD $V --resident --tokens 1,2,3,4,5,6,7,8 -n 128
done
gen v3q8_new $NEW $V8 --resident --tokens 1,2,3,4,5,6,7,8 -n 128
gen v3q8_old $OLD $V8 --resident --tokens 1,2,3,4,5,6,7,8 -n 128
snap
gen v3_new_long $NEW $V --resident --tokens $LT -n 128 --ctx 4096
gen v3_old_long $OLD $V --resident --tokens $LT -n 128 --ctx 4096
gen k3_new $NEW $K --resident --tokens 1,2,3,4,5,6,7,8 -n 128
gen v3_stream_new $NEW $V --budget 3G --tokens 1,2,3,4,5,6,7,8 -n 64
gen v3_stream_old $OLD $V --budget 3G --tokens 1,2,3,4,5,6,7,8 -n 64
snap
