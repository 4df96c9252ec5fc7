#!/usr/bin/env bash
# Session 35, call 2 (H200, the machine of call 1 still warm: its models and llama-bench build; call 1 failed to compile Q5_0 (a global BLOCK_BYTES not a constexpr: the interpreter allows it), so its new-tree runs are redone here, carry [".whl", ".cache"]): MLA's per-head matrices from the file's blocks (Weights.stacked,
# the grouped GEMV) and the Q5_0 family, against 4858010 (.cache/old: session 34's last tree) side by side on
# DeepSeek-V3-shaped and Kimi-K3-shaped files; attn_k_b in Q5_0 as llama-quantize writes it in a Q4_K_M file;
# llama-bench built with CUDA (cuda_side_by_side.sh BUILD_ONLY=1) on the same files; the GPU tests of this session's
# kernels and layers; bench/gpu_box/mla_heads_bench.py. Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW
W=/var/tmp/sparkd-cuda; mkdir -p $W
V=/var/tmp/deepseek-v3-5l-16e-Q4_K.gguf
V8=/var/tmp/deepseek-v3-5l-16e-Q8_0.gguf
K=/var/tmp/kimi-k3-5l-32e-Q4_K.gguf
mk() { [ -f $1 ] || python3 -m sparkd.engine.cli make-model "$@" --quiet; }
mk $V --preset deepseek-v3 --experts 16 --layers 5 --quant Q4_K --tensor-type attn_k_b=Q5_0
mk $V8 --preset deepseek-v3 --experts 16 --layers 5 --quant Q8_0
mk $K --preset kimi-k3 --experts 32 --layers 5 --quant Q4_K --tensor-type attn_k_b=Q5_0
log "models: $(ls -la /var/tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_q5_0_int.py tests/engine/test_q4_0_int.py \
  tests/engine/test_mla_prompt.py tests/engine/test_kernels.py tests/engine/test_kernel_engine.py \
  tests/engine/test_nibble_tiles.py \
  -k "Q5_0 or q5_0 or dense_is or grouped or integer_sums or mla or q4_0 or Q4_0" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
log "llama-bench from call 1: $(ls -la $W/llama-cuda/llama-bench)"
snap
timeout 120 python3 bench/gpu_box/mla_heads_bench.py --sweep --json $R/mla_heads.json > $R/mla_heads.txt 2>&1
log "mla_heads rc $?"
snap
L=$W/llama-cuda/llama-bench
for m in V V8 K; do
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
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ')"
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
gen k3_old $OLD $K --resident --tokens 1,2,3,4,5,6,7,8 -n 128
snap
gen v3_stream_new $NEW $V --budget 3G --tokens 1,2,3,4,5,6,7,8 -n 64
gen v3_stream_old $OLD $V --budget 3G --tokens 1,2,3,4,5,6,7,8 -n 64
snap
