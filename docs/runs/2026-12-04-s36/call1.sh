#!/usr/bin/env bash
# Session 36's planned call (H200; NOT RUN in session 36: no machine was lent). For the next session's first call,
# carry [".whl", ".cache"] with .cache/old = 136ed8a (session 35's last: `rm -rf .cache/old && mkdir -p .cache/old &&
# git archive 136ed8a sparkd | tar -x -C .cache/old`). What it checks and times:
#   1. the GPU tests no machine ran: session 35's IQ4_NL, Q5_1, the embedding lookup and q4_0's constexpr branch;
#      session 36's F16 / BF16 families (GEMV, GEMM at tf32, MoE, embedding, the engine), DeepSeek V4's window
#      rows (static step and segments against the eager step) and Kimi K3's float16 latent rows;
#   2. kernels_bench: F16 / BF16 GEMV against torch.mv on the 16-bit matrix (cuBLAS), Q8_0 beside them;
#   3. generate, old tree vs new, from /tmp (each tree's sparkd.__file__ logged): a 4-layer gpt-oss-20b-shaped F16
#      file (MXFP4 experts, the rest F16: unsloth's F16 layout), where the old tree held the F16 weights as f32; the
#      5-layer DeepSeek V4 Flash Q4_K (window rows: should be no slower), prompts of 8 and 2000 tokens;
#   4. llama-bench on the same files (CUDA build from the vendored source, started after the tests: GPU tests run
#      during the build timed out in session 35).
# Results: $OUT/res.tgz (tests, bench JSON, gen JSON, llama JSON), $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res1; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res1; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW
timeout 280 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_fallback_types.py \
  tests/engine/test_q4_0_int.py tests/engine/test_nibble_tiles.py tests/engine/test_kernels.py \
  tests/engine/test_kernel_engine.py tests/engine/test_deepseek4_fused.py tests/engine/streaming/test_graph_step.py \
  tests/engine/test_kv_f16.py -k "IQ4_NL or iq4_nl or Q5_1 or q4_0 or Q4_0 or embedding or dequantize or mla_head or \
token_embedding or F16 or half or 16_bit or deepseek4 or kimi or f16" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
snap
W=/var/tmp/sparkd-cuda; mkdir -p $W
OUT=$R/llama WORK=$W BUILD_ONLY=1 bash bench/gpu_box/cuda_side_by_side.sh > $R/llama_build.log 2>&1 & LB=$!
timeout 150 python3 bench/kernels_bench.py --types F16,BF16,Q8_0 --shapes dense0,dense1 --unified off \
  --json $R/kernels.json > $R/kernels.txt 2>&1
log "kernels_bench rc $?: $(grep -c gemv $R/kernels.txt) rows"
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
D=/var/tmp/deepseek-v4-5l-16e-Q4_K.gguf
mk() { [ -f $1 ] || python3 -m sparkd.engine.cli make-model "$@" --quiet; }
mk $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4
mk $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K
log "models: $(ls -la /var/tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
snap
gen() {  # tag tree model [args...]; from /tmp: `python3 -m` puts the working directory first on sys.path
  local tag=$1 tree=$2 m=$3; shift 3
  (cd /tmp && PYTHONPATH=/tmp/site:$tree timeout 120 python3 -c "import sparkd; print(sparkd.__file__)" > $R/tree_$tag.txt;
   PYTHONPATH=/tmp/site:$tree timeout 120 python3 -m sparkd.engine.cli generate $m --device cuda --json \
    "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ')"
}
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
for r in 1 2; do
  gen oss_new_$r $NEW $G --resident --tokens 1,2,3,4,5,6,7,8 -n 128
  gen oss_old_$r $OLD $G --resident --tokens 1,2,3,4,5,6,7,8 -n 128
  gen v4_new_$r $NEW $D --resident --tokens 1,2,3,4,5,6,7,8 -n 128
  gen v4_old_$r $OLD $D --resident --tokens 1,2,3,4,5,6,7,8 -n 128
done
gen oss_new_long $NEW $G --resident --tokens $LT -n 64 --ctx 4096
gen oss_old_long $OLD $G --resident --tokens $LT -n 64 --ctx 4096
gen v4_new_long $NEW $D --resident --tokens $LT -n 64 --ctx 4096
gen v4_old_long $OLD $D --resident --tokens $LT -n 64 --ctx 4096
snap
wait $LB
log "llama build: $(tail -2 $R/llama_build.log | tr '\n' ' ')"
L=$W/llama-cuda/llama-bench
for m in G D; do
  f=${!m}
  timeout 120 $L -o json -m $f -ngl 99 -p 8,2000 -n 128 -r 2 > $R/llama_$m.json 2> $R/llama_$m.err
  log "llama-bench $m rc $?: $(grep -o '"n_prompt": [0-9]*\|"n_gen": [0-9]*\|"avg_ts": [0-9.e+]*' $R/llama_$m.json | tr '\n' ' ')"
done
snap
