#!/usr/bin/env bash
# Session 13 final calls (H200, carry [".whl", ".cache"]) on the merged main, in two parts:
#   (after prefix13, prefill28, moe23, down13, graphs13 and tests13 were merged)
#   PART=tests  every gpu-marked test in 11 parallel pytest groups (the 11th: the supervisor's GPU guard
#               refusing a real CUDA process, tests/test_daemon_cgroupfs.py), llama.cpp's CUDA build and the
#               two 12-layer models made in the background meanwhile, then the kernel-goal rows: the dense
#               GEMVs (Q8_0P, Q4T, Q6T at the five shapes; PDL off/on x weight prefetch off/small, with the
#               same-bytes copy) and the MoE layer defaults.
#   PART=bench  (right after, on the warm box: the build and models are reused, else made again) the
#               resident decode vs llama-bench (graphs); session 12's Q4_K state (SPARKD_IGEMM=s12,
#               SPARKD_MOE_DOWN_LAYOUT=tiled, SPARKD_MOE_DOWN_LAUNCH=start) against this session's defaults
#               in the decode (a process each, interleaved) and in prompts; prompt processing at 128 / 512 /
#               1024 / 2048 tokens (eager int8 and the prompt graphs) vs llama-bench -p in the same call; the
#               prompt graphs captured at load; a two-turn chat's second turn with the prompt cache on / off.
# Results: $OUT/res.tgz + $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet --layers 12 && mv $1.part $1; }; }
build() { OUT=/tmp/bo BUILD_ONLY=1 nice -n 5 bash bench/gpu_box/cuda_side_by_side.sh > /tmp/build.log 2>&1; }
if [ "${PART:-tests}" = tests ]; then
  build & B=$!
  (mk $W/q3-12-Q8_0.gguf Q8_0; mk $W/q3-12-Q4_K.gguf Q4_K) > /tmp/make.log 2>&1 & M=$!
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
     "$E/test_device_sampler.py $E/test_device_sampler_fused.py $E/test_device_argmax.py $E/test_pdl.py $E/test_feed_tokens.py $E/streaming tests/guards/test_gpu_guard.py"
     "$E/test_cuda_graphs.py $E/test_prompt_cache.py"
     "tests/test_daemon_cgroupfs.py -k gpu_guard")
  P=()
  for i in "${!G[@]}"; do
    eval timeout ${TEST_TIMEOUT:-350} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE ${G[$i]} > $R/gpu_tests_$((i+1)).log 2>&1 & P+=($!)
  done
  for i in "${!P[@]}"; do wait ${P[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/gpu_tests_$((i+1)).log)"; done
  grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $OUT/log.txt; snap
  timeout 70 python3 bench/gemv_tiles_bench.py --types Q8_0P,Q4T,Q6T --shapes 151936x2048,14336x4096,4096x14336,6144x4096,4096x2048 \
    --prefetch off,small --qx --no-act-quant --compile-workers 12 --json $R/gemv.json > $R/gemv.log 2>&1
  log "gemv rc $?"; snap
  PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 80 python3 bench/moe_tiles_bench.py --defaults-only --types Q8_0,Q4_K,Q4_KXD \
    --compile-workers 8 --json $R/moe.json > $R/moe.log 2>&1
  log "moe rc $?"
  wait $B; log "build rc $? $(ls $W/llama-cuda/llama-bench 2>&1)"; wait $M
  log "models $(ls -la $W/*.gguf | awk '{print $5}' | tr '\n' ' ')"
  cp /tmp/build.log /tmp/make.log $R/ 2>/dev/null; snap
else
  [ -x $W/llama-cuda/llama-bench ] || { log "building llama.cpp again (a fresh box)"; build & }
  mk $W/q3-12-Q8_0.gguf Q8_0; mk $W/q3-12-Q4_K.gguf Q4_K; wait
  log "warm: $(ls $W | tr '\n' ' ')"
  S12="SPARKD_IGEMM=s12 SPARKD_MOE_DOWN_LAYOUT=tiled SPARKD_MOE_DOWN_LAUNCH=start"  # session 12's Q4_K state
  for r in 1 2; do for way in s13 s12; do
    env $([ $way = s12 ] && echo $S12) timeout 60 python3 -m sparkd.engine.cli generate $W/q3-12-Q4_K.gguf --tokens 1,2,3,4,5,6,7,8 \
      -n 128 --device cuda --resident --cuda-graphs on --json > $R/decode_Q4_K_${way}_$r.json 2> $R/decode_Q4_K_${way}_$r.err
    log "decode Q4_K $way #$r rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/decode_Q4_K_${way}_$r.json)"
  done; done; snap
  OUT=/tmp/sbs CUDA_GRAPHS=on TOKENS=128 STREAM=0 LLAMA_WAIT=60 timeout 150 bash bench/gpu_box/cuda_side_by_side.sh > $R/sbs.log 2>&1
  log "sbs rc $?: $(grep resident /tmp/sbs/summary.md 2>/dev/null | tr '\n' ' ')"; cp /tmp/sbs/summary.md $R/sbs_summary.md 2>/dev/null; snap
  for q in Q8_0 Q4_K; do
    ln -sf $W/q3-12-$q.gguf /tmp/q30-12l-$q.gguf
    (cd bench/gpu_box && timeout 150 python3 prefill_bench.py --model $W/q3-12-$q.gguf --tokens 128,512,1024,2048 \
      --variants ${PREFILL_VARIANTS:-int8,graphs,int8,graphs} --profile graphs --json $R/prefill_$q.json) > $R/prefill_$q.log 2>&1
    log "prefill $q rc $?: $(grep -E ' (128|512|1024|2048) tokens' $R/prefill_$q.log | tr -s ' ' | tr '\n' ';')"
    [ $q = Q4_K ] && { (cd bench/gpu_box && env $S12 timeout 100 python3 prefill_bench.py --model $W/q3-12-$q.gguf \
      --tokens 128,512,1024,2048 --variants graphs,graphs --json $R/prefill_${q}_s12.json) > $R/prefill_${q}_s12.log 2>&1
      log "prefill $q s12 state rc $?: $(grep -E ' (128|512|1024|2048) tokens' $R/prefill_${q}_s12.log | tr -s ' ' | tr '\n' ';')"; }
    timeout 60 $W/llama-cuda/llama-bench -m $W/q3-12-$q.gguf -ngl 99 -p 128,512,1024,2048 -n 0 -r 3 -o json > $R/llama_pp_$q.json 2> $R/llama_pp_$q.err
    log "llama pp $q rc $?: $(grep avg_ts $R/llama_pp_$q.json 2>/dev/null | tr -s ' ' | tr '\n' ' ')"; snap
  done
  timeout 120 python3 bench/gpu_box/prompt_graphs_load.py --model $W/q3-12-Q8_0.gguf --json $R/prompt_graphs_load.json \
    > $R/prompt_graphs_load.log 2>&1
  log "prompt graphs at load rc $?: $(tail -4 $R/prompt_graphs_load.log | tr '\n' ';')"
  timeout 90 python3 bench/gpu_box/prompt_cache_bench.py --model $W/q3-12-Q8_0.gguf --json $R/prompt_cache.json \
    > $R/prompt_cache.log 2>&1
  log "prompt cache rc $?: $(tail -6 $R/prompt_cache.log | tr '\n' ';')"
  log done; snap
fi
