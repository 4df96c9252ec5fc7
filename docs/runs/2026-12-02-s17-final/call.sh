#!/usr/bin/env bash
# Session 17 final calls (H200, carry [".whl", ".cache"]) on the merged main, in two parts:
#   PART=tests  llama.cpp's CUDA build and the two 12-layer models in the background; every gpu-marked test in
#               12 parallel pytest groups (session 15's group 1 split in two: it ran past 330 s); then the MoE
#               layer defaults with moe39's floor rows (the layer's bytes as copies).
#   PART=bench  (right after, on the warm box: the build and models are reused, else made again) the resident
#               decode vs llama-bench (graphs); temperature decodes a process each (greedy, top_k 0, top_k 40,
#               top_p 0.95); the OpenAI server's streamed temperature decode (serve --top-k 0 / 0 on the torch
#               chain / 0 with top_p 0.95); a chat's next turn past 2048 tokens (the eager continuation's
#               bottom-right causal mask against the boolean one). kimi-k3's chunked KDA prompt: kda36's own call.
#               Prompts alone, streaming and the decode after a prompt did not change: not timed again.
# LLAMA=0: no llama.cpp build, no side by side; MOE=0: no MoE rows (session 17's one call: the resident decode and
# the MoE kernels did not change (moe39's call has the MoE rows) and a failed machine start had cost 91 s). Results: $OUT/res.tgz + $OUT/log.txt. Every step has a timeout;
# END_S bounds the bench part.
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
models() { mk $W/q3-12-Q8_0.gguf Q8_0 "--layers 12"; mk $W/q3-12-Q4_K.gguf Q4_K "--layers 12"; }
if [ "${PART:-tests}" = tests ]; then
  [ "${LLAMA:-1}" = 1 ] && { build & B=$!; }
  models > /tmp/make.log 2>&1 & M=$!
  E=tests/engine
  K="int8 or igemm or grouped or prefill or gemm"
  G=("$E/test_kernels.py -k \"int8 or igemm\""
     "$E/test_kernels.py -k \"($K) and not (int8 or igemm)\""
     "$E/test_kernels.py -k \"not ($K)\""
     "$E/test_fused_kernels.py $E/test_norm_quant.py $E/test_norm_fold.py $E/test_split_fold.py"
     "$E/test_quants.py $E/test_iq_kernels.py $E/test_q6_k_int.py $E/test_q6_k_tiled.py"
     "$E/test_q4_k_tiled.py $E/test_row_tiles.py $E/test_q4t_compact.py $E/test_q4t_pair.py $E/test_q4t_relaid.py $E/test_q4t_tma.py $E/test_gemv_split.py"
     "$E/test_int_kernels.py $E/test_fused_qkv.py $E/test_kernel_determinism.py"
     "$E/test_kernel_engine.py $E/test_eager_decode.py $E/test_kimi_k3.py"
     "$E/test_moe_decode_fusion.py $E/test_moe_tiles.py $E/test_moe_tiled.py $E/test_moe_down_full.py $E/test_moe_twin.py $E/test_moe_words_full.py $E/test_moe_reference.py"
     "$E/test_device_sampler.py $E/test_device_sampler_fused.py $E/test_device_argmax.py $E/test_pdl.py $E/test_feed_tokens.py $E/test_decode_pipeline.py $E/streaming tests/guards/test_gpu_guard.py"
     "$E/test_cuda_graphs.py $E/test_prompt_cache.py"
     "tests/test_daemon_cgroupfs.py -k gpu_guard")
  P=()
  for i in "${!G[@]}"; do
    eval timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE ${G[$i]} > $R/gpu_tests_$((i+1)).log 2>&1 & P+=($!)
  done
  for i in "${!P[@]}"; do wait ${P[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/gpu_tests_$((i+1)).log)"; done
  grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $OUT/log.txt; snap
  [ "${MOE:-1}" = 1 ] && PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 110 python3 bench/moe_tiles_bench.py --defaults-only --floor --types Q8_0,Q4_K,Q4_KXD \
    --compile-workers 8 --json $R/moe.json > $R/moe.log 2>&1
  log "moe rc $?"
  [ "${LLAMA:-1}" = 1 ] && { wait $B; log "build rc $? $(ls $W/llama-cuda/llama-bench 2>&1)"; }; wait $M
  log "models $(ls -la $W/*.gguf | awk '{print $5}' | tr '\n' ' ')"
  cp /tmp/build.log /tmp/make.log $R/ 2>/dev/null; snap
else
  [ "${LLAMA:-1}" = 1 ] && [ ! -x $W/llama-cuda/llama-bench ] && { log "building llama.cpp again (a fresh box)"; build & }
  models > /tmp/make.log 2>&1; wait
  log "warm: $(ls $W | tr '\n' ' ')"
  [ "${LLAMA:-1}" = 1 ] && OUT=/tmp/sbs CUDA_GRAPHS=on TOKENS=128 STREAM=0 LLAMA_WAIT=60 timeout 150 bash bench/gpu_box/cuda_side_by_side.sh > $R/sbs.log 2>&1
  log "sbs rc $?: $(grep resident /tmp/sbs/summary.md 2>/dev/null | tr '\n' ' ')"; cp /tmp/sbs/summary.md $R/sbs_summary.md 2>/dev/null; snap
  # temperature decodes, a process each: greedy; top_k 0 on the full draw (draw32); top_k 40 on the candidates
  # draw; top_p 0.95 with top_k 0 on the torch chain (draw33's device top-p lost: 871 against 209 us a draw)
  gen() {  # quant tag [more flags]
    timeout 40 python3 -m sparkd.engine.cli generate $W/q3-12-$1.gguf --tokens 1,2,3,4,5,6,7,8 \
      -n 128 --device cuda --resident --cuda-graphs on --json ${@:3} > $R/gen_$1_$2.json 2> $R/gen_$1_$2.err
    log "decode $1 $2 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$1_$2.json)"
  }
  gen Q4_K greedy; gen Q4_K full --temp 0.8 --seed 1; gen Q4_K top40 --temp 0.8 --top-k 40 --seed 1
  gen Q4_K topp95 --temp 0.8 --top-p 0.95 --seed 1; snap
  # a chat's next turn past the prompt graphs' 2048 rows: 1024 of 4096 cached continues eagerly; its attention through
  # SDPA's bottom-right causal mask (sdpa, session 17's default) vs the boolean mask (sdpa-mask); "off" = the whole prompt
  for way in sdpa sdpa-mask; do
    [ $(left) -gt 45 ] && { SPARKD_CONTINUE_ATTENTION=$way timeout 50 python3 bench/gpu_box/prompt_cache_bench.py \
        --model $W/q3-12-Q4_K.gguf --turn1 1008:16:3072 --ctx 8192 --reps 2 --no-gap \
        --json $R/prompt_cache_$way.json > $R/prompt_cache_$way.log 2>&1
      log "prompt cache $way rc $?"; grep -E "^turn" $R/prompt_cache_$way.log | cut -c1-260 | tee -a $OUT/log.txt; snap; }
  done
  # the OpenAI server's streamed temperature decode through the openai client: --top-k 0 (the full draw), 0 on the
  # torch chain (capped), and 0 with top_p 0.95 in the requests (the chain); never timed on the box before (top_k 40:
  # session 16's 1404.6 tok/s)
  [ $(left) -gt 60 ] && timeout 50 python3 bench/gpu_box/serve_decode_bench.py --model $W/q3-12-Q4_K.gguf --top-k 0 --reps 2 \
    --json $R/serve.json > $R/serve.log 2>&1; log "serve rc $?: $(grep top-k $R/serve.log | tr '\n' ';')"
  [ $(left) -gt 55 ] && SPARKD_DEVICE_SAMPLING=capped timeout 50 python3 bench/gpu_box/serve_decode_bench.py --model $W/q3-12-Q4_K.gguf \
    --top-k 0 --reps 2 --json $R/serve_capped.json > $R/serve_capped.log 2>&1; log "serve capped rc $?: $(grep top-k $R/serve_capped.log)"
  [ $(left) -gt 55 ] && timeout 50 python3 bench/gpu_box/serve_decode_bench.py --model $W/q3-12-Q4_K.gguf --top-k 0 --top-p 0.95 \
    --reps 2 --json $R/serve_topp.json > $R/serve_topp.log 2>&1; log "serve top_p rc $?: $(grep top-k $R/serve_topp.log)"; snap
  log done; snap
fi
