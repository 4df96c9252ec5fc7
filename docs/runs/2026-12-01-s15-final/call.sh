#!/usr/bin/env bash
# Session 15 final calls (H200, carry [".whl", ".cache"]) on the merged main, in two parts:
#   PART=tests  llama.cpp's CUDA build, the two 12-layer models and the 10 GB streaming model in the background;
#               every gpu-marked test in 11 parallel pytest groups; then the MoE layer defaults (moe26's 4096 tier;
#               the dense GEMVs did not change since session 13: not timed again).
#   PART=bench  (right after, on the warm box: the build and models are reused, else made again) the resident
#               decode vs llama-bench (graphs); the pipelined decode (pipe27) auto / off; prompts at 128 / 512 / 1024 / 2048 tokens vs llama-bench -p;
#               the decode after a 512-token prompt (split attention auto / off) vs llama-bench -d 512; the
#               streaming decode under memory.max 3G (no VRAM cache) vs llama.cpp with its
#               experts mapped from the file; a chat's next turn with many new tokens, continuations on SDPA / attend.
# Results: $OUT/res.tgz + $OUT/log.txt. Every step has a timeout; END_S bounds the whole part.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); END=${END_S:-400}; left() { echo $(( END - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet $3 && mv $1.part $1; }; }
build() { OUT=/tmp/bo BUILD_ONLY=1 nice -n 5 bash bench/gpu_box/cuda_side_by_side.sh > /tmp/build.log 2>&1; }
models() { mk $W/q3-12-Q8_0.gguf Q8_0 "--layers 12"; mk $W/q3-12-Q4_K.gguf Q4_K "--layers 12"; mk $W/q3-stream-10G.gguf Q8_0 "--size 10G"; }
if [ "${PART:-tests}" = tests ]; then
  build & B=$!
  models > /tmp/make.log 2>&1 & M=$!
  E=tests/engine
  K="int8 or igemm or grouped or prefill or gemm"
  G=("$E/test_kernels.py -k \"$K\""
     "$E/test_kernels.py -k \"not ($K)\""
     "$E/test_fused_kernels.py $E/test_norm_quant.py $E/test_norm_fold.py $E/test_split_fold.py"
     "$E/test_quants.py $E/test_iq_kernels.py $E/test_q6_k_int.py $E/test_q6_k_tiled.py"
     "$E/test_q4_k_tiled.py $E/test_row_tiles.py $E/test_q4t_compact.py $E/test_q4t_pair.py $E/test_q4t_relaid.py $E/test_q4t_tma.py $E/test_gemv_split.py"
     "$E/test_int_kernels.py $E/test_fused_qkv.py $E/test_kernel_determinism.py"
     "$E/test_kernel_engine.py $E/test_eager_decode.py"
     "$E/test_moe_decode_fusion.py $E/test_moe_tiles.py $E/test_moe_tiled.py $E/test_moe_down_full.py $E/test_moe_twin.py $E/test_moe_words_full.py $E/test_moe_reference.py"
     "$E/test_device_sampler.py $E/test_device_sampler_fused.py $E/test_device_argmax.py $E/test_pdl.py $E/test_feed_tokens.py $E/test_decode_pipeline.py $E/streaming tests/guards/test_gpu_guard.py"
     "$E/test_cuda_graphs.py $E/test_prompt_cache.py"
     "tests/test_daemon_cgroupfs.py -k gpu_guard")
  P=()
  for i in "${!G[@]}"; do
    eval timeout ${TEST_TIMEOUT:-360} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE ${G[$i]} > $R/gpu_tests_$((i+1)).log 2>&1 & P+=($!)
  done
  for i in "${!P[@]}"; do wait ${P[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/gpu_tests_$((i+1)).log)"; done
  grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $OUT/log.txt; snap
  PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 80 python3 bench/moe_tiles_bench.py --defaults-only --types Q8_0,Q4_K,Q4_KXD \
    --compile-workers 8 --json $R/moe.json > $R/moe.log 2>&1
  log "moe rc $?"
  wait $B; log "build rc $? $(ls $W/llama-cuda/llama-bench 2>&1)"; wait $M
  log "models $(ls -la $W/*.gguf | awk '{print $5}' | tr '\n' ' ')"
  cp /tmp/build.log /tmp/make.log $R/ 2>/dev/null; snap
else
  [ -x $W/llama-cuda/llama-bench ] || { log "building llama.cpp again (a fresh box)"; build & }
  models > /tmp/make.log 2>&1; wait
  log "warm: $(ls $W | tr '\n' ' ')"
  OUT=/tmp/sbs CUDA_GRAPHS=on TOKENS=128 STREAM=0 LLAMA_WAIT=60 timeout 150 bash bench/gpu_box/cuda_side_by_side.sh > $R/sbs.log 2>&1
  log "sbs rc $?: $(grep resident /tmp/sbs/summary.md 2>/dev/null | tr '\n' ' ')"; cp /tmp/sbs/summary.md $R/sbs_summary.md 2>/dev/null; snap
  # the pipelined decode (pipe27) against the loop before it, a process each, interleaved; greedy, and a seeded draw
  gen() {  # quant way tag [more flags]
    SPARKD_DECODE_PIPELINE=$2 timeout 40 python3 -m sparkd.engine.cli generate $W/q3-12-$1.gguf --tokens 1,2,3,4,5,6,7,8 \
      -n 128 --device cuda --resident --cuda-graphs on --json ${@:4} > $R/pipe_$1_$3.json 2> $R/pipe_$1_$3.err
    log "decode $1 pipeline $3 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/pipe_$1_$3.json)"
  }
  gen Q4_K auto auto1; gen Q4_K off off1; gen Q4_K auto auto2; gen Q4_K off off2; gen Q8_0 auto auto1; gen Q8_0 off off1
  gen Q4_K auto temp_auto --temp 0.8 --seed 1; gen Q4_K off temp_off --temp 0.8 --seed 1
  python3 -c "import json,sys; t=[json.load(open('$R/pipe_Q4_K_'+k+'.json'))['tokens'] for k in sys.argv[1:]]; print('Q4_K tokens equal, greedy:', t[0] == t[1] == t[2] == t[3], 'draw:', t[4] == t[5])" \
    auto1 off1 auto2 off2 temp_auto temp_off 2>&1 | tee -a $OUT/log.txt; snap
  # decode after a 512-token prompt (positions 512-640: step26's split attention), a process each, vs llama-bench -d 512
  for q in Q4_K; do for way in auto off; do
    SPARKD_DECODE_ATTENTION_SPLIT=$way timeout 60 python3 -m sparkd.engine.cli generate $W/q3-12-$q.gguf --tokens $(seq -s, 1 512) \
      -n 128 --device cuda --resident --cuda-graphs on --json > $R/depth_${q}_$way.json 2> $R/depth_${q}_$way.err
    log "decode at 512 $q split $way rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/depth_${q}_$way.json)"
  done
  timeout 40 $W/llama-cuda/llama-bench -m $W/q3-12-$q.gguf -ngl 99 -p 0 -n 128 -d 512 -r 3 -o json > $R/llama_depth_$q.json 2> $R/llama_depth_$q.err
  log "llama decode at 512 $q rc $?: $(grep avg_ts $R/llama_depth_$q.json 2>/dev/null | tr -s ' ' | tr '\n' ' ')"; snap
  done
  for q in Q4_K Q8_0; do
    (cd bench/gpu_box && timeout 60 python3 prefill_bench.py --model $W/q3-12-$q.gguf --tokens 128,512,1024,2048 \
      --variants graphs,graphs --profile "" --json $R/prefill_$q.json) > $R/prefill_$q.log 2>&1
    log "prefill $q rc $?: $(grep -E ' (128|512|1024|2048) tokens' $R/prefill_$q.log | tr -s ' ' | tr '\n' ';')"
    timeout 60 $W/llama-cuda/llama-bench -m $W/q3-12-$q.gguf -ngl 99 -p 128,512,1024,2048 -n 0 -r 3 -o json > $R/llama_pp_$q.json 2> $R/llama_pp_$q.err
    log "llama pp $q rc $?: $(grep avg_ts $R/llama_pp_$q.json 2>/dev/null | tr -s ' ' | tr '\n' ' ')"; snap
  done
  [ $(left) -gt 100 ] && { OUT=/tmp/stream LLAMA_WAIT=5 QUANTS="" STREAM_TOKENS=64 STREAM_TIMEOUT=40 LLAMA_STREAM_TOKENS=16 \
    DISK_BLOCKS=1M DISK_DEPTHS=8 DISK_SECONDS=1 STREAM_VRAM_BUDGETS="0" timeout $(( $(left) - 40 )) \
    bash bench/gpu_box/cuda_side_by_side.sh > $R/stream.log 2>&1
    log "stream rc $?: $(grep -E '^\| stream' /tmp/stream/summary.md 2>/dev/null | head -4 | tr '\n' ' ')"; cp /tmp/stream/summary.md $R/stream_summary.md 2>/dev/null; snap; }
  # a chat's next turn with many new tokens: continuations on SDPA from 128 queries (prefill31) vs attend (torch)
  for way in sdpa torch; do [ $(left) -gt 45 ] || break
    SPARKD_CONTINUE_ATTENTION=$way timeout $(( $(left) > 75 ? 70 : $(left) - 5 )) python3 bench/gpu_box/prompt_cache_bench.py \
      --model $W/q3-12-Q4_K.gguf --turn1 512:16:240,512:16:1008,1024:16:1008,2048:16:512,256:16:1776 --reps 3 --no-gap \
      --json $R/prompt_cache_$way.json > $R/prompt_cache_$way.log 2>&1
    log "prompt cache $way rc $?: $(tail -7 $R/prompt_cache_$way.log | tr '\n' ';')"; snap
  done
  log done; snap
fi
