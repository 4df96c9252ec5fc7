#!/usr/bin/env bash
# Session 10 final calls (H200, carry [".whl", ".cache"]) on the merged main, in two parts so that the
# whole GPU suite gets room (session 9's 170 s groups timed out):
#   PART=tests  every gpu-marked test in 8 parallel pytest groups (llama.cpp's CUDA build and the two
#               12-layer models made in the background meanwhile), then the MoE layer defaults incl.
#               moe21's Q4_K down on pairx bytes (Q4_KXD) against the GGUF down (Q4_KX).
#   PART=bench  (right after, on the warm box: the build and models are reused, else made again) the
#               resident decode vs llama-bench (graphs), and prompt processing at 512 / 2048 tokens:
#               session 9's int8 way (s9) and session 10's defaults (int8) interleaved, ieee (last)
#               as the K-quants' way before, vs llama-bench -p 512,2048.
# Results: $OUT/res.tgz + $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet --layers 12 && mv $1.part $1; }; }
build() { OUT=/tmp/bo BUILD_ONLY=1 nice -n 5 bash bench/gpu_box/cuda_side_by_side.sh > /tmp/build.log 2>&1; }
if [ "${PART:-tests}" = tests ]; then
  build & B=$!
  (mk $W/q3-12-Q8_0.gguf Q8_0; mk $W/q3-12-Q4_K.gguf Q4_K) > /tmp/make.log 2>&1 & M=$!
  E=tests/engine
  G=("$E/test_kernels.py"
     "$E/test_fused_kernels.py $E/test_norm_quant.py $E/test_norm_fold.py $E/test_split_fold.py"
     "$E/test_quants.py $E/test_iq_kernels.py $E/test_q6_k_int.py $E/test_q6_k_tiled.py"
     "$E/test_q4_k_tiled.py $E/test_row_tiles.py $E/test_q4t_compact.py $E/test_q4t_pair.py $E/test_q4t_relaid.py $E/test_q4t_tma.py $E/test_gemv_split.py"
     "$E/test_int_kernels.py $E/test_fused_qkv.py $E/test_kernel_determinism.py"
     "$E/test_kernel_engine.py $E/test_eager_decode.py"
     "$E/test_moe_decode_fusion.py $E/test_moe_tiles.py $E/test_moe_tiled.py $E/test_moe_down_full.py $E/test_moe_twin.py $E/test_moe_words_full.py $E/test_moe_reference.py"
     "$E/test_device_sampler.py $E/test_device_sampler_fused.py $E/test_device_argmax.py $E/test_cuda_graphs.py $E/test_pdl.py $E/test_feed_tokens.py $E/streaming tests/guards/test_gpu_guard.py")
  P=()
  for i in "${!G[@]}"; do
    timeout ${TEST_TIMEOUT:-350} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE ${G[$i]} > $R/gpu_tests_$((i+1)).log 2>&1 & P+=($!)
  done
  for i in "${!P[@]}"; do wait ${P[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/gpu_tests_$((i+1)).log)"; done
  PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 100 python3 bench/moe_tiles_bench.py --defaults-only --types Q8_0,Q4_K,Q4_KX,Q4_KXD \
    --compile-workers 8 --json $R/moe.json > $R/moe.log 2>&1
  log "moe rc $?"
  wait $B; log "build rc $? $(ls $W/llama-cuda/llama-bench 2>&1)"; wait $M
  log "models $(ls -la $W/*.gguf | awk '{print $5}' | tr '\n' ' ')"
  tar czf $OUT/res.tgz -C /tmp res build.log make.log 2>/dev/null
else
  [ -x $W/llama-cuda/llama-bench ] || { log "building llama.cpp again (a fresh box)"; build & }
  mk $W/q3-12-Q8_0.gguf Q8_0; mk $W/q3-12-Q4_K.gguf Q4_K; wait
  log "warm: $(ls $W)"
  OUT=/tmp/sbs CUDA_GRAPHS=on TOKENS=128 STREAM=0 LLAMA_WAIT=60 timeout 150 bash bench/gpu_box/cuda_side_by_side.sh > /tmp/sbs.log 2>&1
  log "sbs rc $?: $(grep resident /tmp/sbs/summary.md 2>/dev/null | tr '\n' ' ')"; cp /tmp/sbs/summary.md $R/sbs_summary.md 2>/dev/null
  for q in Q8_0 Q4_K; do
    (cd bench/gpu_box && timeout 150 python3 prefill_bench.py --model $W/q3-12-$q.gguf --tokens 512,2048 \
      --variants ${PREFILL_VARIANTS:-last,s9,int8,s9,int8} --profile int8 --json $R/prefill_$q.json) > $R/prefill_$q.log 2>&1
    log "prefill $q rc $?: $(grep -E ' (512|2048) tokens' $R/prefill_$q.log | tr -s ' ' | tr '\n' ';')"
    timeout 40 $W/llama-cuda/llama-bench -m $W/q3-12-$q.gguf -ngl 99 -p 512,2048 -n 0 -r 3 -o json > $R/llama_pp_$q.json 2> $R/llama_pp_$q.err
    log "llama pp $q rc $?: $(grep avg_ts $R/llama_pp_$q.json 2>/dev/null | tr -s ' ' | tr '\n' ' ')"
  done
  log done; cp $OUT/log.txt $R/
  tar czf $OUT/res.tgz -C /tmp res sbs sbs.log 2>/dev/null
fi
