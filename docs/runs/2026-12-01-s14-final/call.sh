#!/usr/bin/env bash
# Session 14 final calls (H200, carry [".whl", ".cache"]) on the merged main, in two parts:
#   (after prefill29, cache24, prefill30 were merged; moe24 and moe24f merged as docs only)
#   PART=tests  every gpu-marked test in 11 parallel pytest groups (the 11th: the supervisor's GPU guard
#               refusing a real CUDA process, tests/test_daemon_cgroupfs.py), llama.cpp's CUDA build and the
#               two 12-layer models made in the background meanwhile. (No kernel rows: the GEMV and MoE decode
#               kernels did not change this session; moe24 / moe24f timed the MoE defaults today.)
#   PART=bench  (right after, on the warm box: the build and models are reused, else made again) the
#               resident decode vs llama-bench (graphs); prompt processing at 128 / 512 / 1024 / 2048 tokens
#               (eager int8 and the prompt graphs, now up to 2048 under SDPA) vs llama-bench -p in the same call,
#               and session 13's prompt attention (SPARKD_PREFILL_ATTENTION=torch) in its own process; two
#               chats taking turns through the prompt store against the single cache (prompt_cache_bench --ab);
#               a two-turn chat's second turn with the prompt cache on / off.
# As run: PART=tests only (425 s on a cold box; group 10 failed on a bug, fixed; call2.sh re-ran it); PART=bench was
# not run: the device time left went to call2.sh. Results: $OUT/res.tgz + $OUT/log.txt.
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
  wait $B; log "build rc $? $(ls $W/llama-cuda/llama-bench 2>&1)"; wait $M
  log "models $(ls -la $W/*.gguf | awk '{print $5}' | tr '\n' ' ')"
  cp /tmp/build.log /tmp/make.log $R/ 2>/dev/null; snap
else
  [ -x $W/llama-cuda/llama-bench ] || { log "building llama.cpp again (a fresh box)"; build & }
  mk $W/q3-12-Q8_0.gguf Q8_0; mk $W/q3-12-Q4_K.gguf Q4_K; wait
  log "warm: $(ls $W | tr '\n' ' ')"
  S13="SPARKD_PREFILL_ATTENTION=torch"  # session 13's prompt attention (and prompt graphs up to 1024)
  OUT=/tmp/sbs CUDA_GRAPHS=on TOKENS=128 STREAM=0 LLAMA_WAIT=60 timeout 150 bash bench/gpu_box/cuda_side_by_side.sh > $R/sbs.log 2>&1
  log "sbs rc $?: $(grep resident /tmp/sbs/summary.md 2>/dev/null | tr '\n' ' ')"; cp /tmp/sbs/summary.md $R/sbs_summary.md 2>/dev/null; snap
  for q in Q8_0 Q4_K; do
    ln -sf $W/q3-12-$q.gguf /tmp/q30-12l-$q.gguf
    (cd bench/gpu_box && timeout 150 python3 prefill_bench.py --model $W/q3-12-$q.gguf --tokens 128,512,1024,2048 \
      --variants ${PREFILL_VARIANTS:-int8,graphs,int8,graphs} --profile graphs --json $R/prefill_$q.json) > $R/prefill_$q.log 2>&1
    log "prefill $q rc $?: $(grep -E ' (128|512|1024|2048) tokens' $R/prefill_$q.log | tr -s ' ' | tr '\n' ';')"
    (cd bench/gpu_box && env $S13 timeout 100 python3 prefill_bench.py --model $W/q3-12-$q.gguf \
      --tokens 128,512,1024,2048 --variants graphs,graphs --json $R/prefill_${q}_s13.json) > $R/prefill_${q}_s13.log 2>&1
    log "prefill $q s13 attention rc $?: $(grep -E ' (128|512|1024|2048) tokens' $R/prefill_${q}_s13.log | tr -s ' ' | tr '\n' ';')"
    timeout 60 $W/llama-cuda/llama-bench -m $W/q3-12-$q.gguf -ngl 99 -p 128,512,1024,2048 -n 0 -r 3 -o json > $R/llama_pp_$q.json 2> $R/llama_pp_$q.err
    log "llama pp $q rc $?: $(grep avg_ts $R/llama_pp_$q.json 2>/dev/null | tr -s ' ' | tr '\n' ' ')"; snap
  done
  timeout 70 python3 bench/gpu_box/prompt_cache_bench.py --model $W/q3-12-Q8_0.gguf --ab --turn1 512,1536 --reps 3 \
    --json $R/prompt_store_ab.json > $R/prompt_store_ab.log 2>&1
  log "prompt store A/B rc $?: $(tail -6 $R/prompt_store_ab.log | tr '\n' ';')"; snap
  timeout 90 python3 bench/gpu_box/prompt_cache_bench.py --model $W/q3-12-Q8_0.gguf --json $R/prompt_cache.json \
    > $R/prompt_cache.log 2>&1
  log "prompt cache rc $?: $(tail -6 $R/prompt_cache.log | tr '\n' ';')"
  log done; snap
fi
