#!/usr/bin/env bash
# Session 9 final measuring call (H200, cold box, carry [".whl", ".cache"]), on the merged main:
# llama.cpp's CUDA build and the two 12-layer models start in the background; meanwhile the GPU tests
# of every test file this session touched (6 parallel pytest groups); then, one at a time: the GEMV
# defaults with PDL off and on (--pdl), the Q6_K tiled candidates again (diag16's 4/1/2 question),
# the MoE defaults (Q4_K gate/up now packed, moe20), the resident side by side vs llama-bench
# (graphs, PDL on), the resident Q4_K with moe20's switch back (SPARKD_MOE_GATE_UP_LAYOUT=gguf), and
# prompt processing at 512 tokens (ieee vs the int8 default, prefill21) vs llama-bench -p 512. Results: $OUT/res.tgz + $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
(OUT=/tmp/bo BUILD_ONLY=1 nice -n 5 setsid bash bench/gpu_box/cuda_side_by_side.sh > /tmp/build.log 2>&1 &)
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet --layers 12 && mv $1.part $1; }; }
(mk $W/q3-12-Q8_0.gguf Q8_0; mk $W/q3-12-Q4_K.gguf Q4_K) > /tmp/make.log 2>&1 & M=$!
E=tests/engine
G1="$E/test_q4_k_tiled.py $E/test_row_tiles.py $E/test_gemv_split.py $E/test_q4t_pair.py $E/test_norm_fold.py $E/test_split_fold.py"
G2="$E/test_q6_k_tiled.py $E/test_moe_tiles.py $E/test_moe_decode_fusion.py $E/test_moe_twin.py $E/test_moe_words_full.py $E/test_moe_down_full.py $E/test_moe_reference.py $E/test_moe_tiled.py"
G3="$E/test_device_sampler.py $E/test_device_sampler_fused.py $E/test_cuda_graphs.py $E/test_device_argmax.py $E/test_pdl.py $E/test_feed_tokens.py"
G4="$E/test_iq_kernels.py $E/test_kernel_engine.py $E/test_norm_quant.py $E/streaming/test_graph_step.py $E/streaming/test_vram_cache.py $E/streaming/test_eager_step.py"
G5="$E/test_int_kernels.py $E/test_fused_qkv.py $E/test_kernel_determinism.py $E/test_q6_k_int.py $E/test_fused_kernels.py"
i=0; P=()
for g in "$G1" "$G2" "$G3" "$G4" "$G5"; do i=$((i+1))
  timeout ${TEST_TIMEOUT:-170} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/gpu_tests_$i.log 2>&1 & P+=($!)
done
timeout ${TEST_TIMEOUT:-170} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $E/test_kernels.py \
  -k "prefill or grouped or expert_tiles or gemm" ${G6_MORE:-} > $R/gpu_tests_6.log 2>&1 & P+=($!)
for j in 0 1 2 3 4 5; do wait ${P[$j]}; log "tests group $((j+1)) rc $? $(tail -1 $R/gpu_tests_$((j+1)).log)"; done
timeout 60 python3 bench/gemv_tiles_bench.py --types Q8_0P,Q4T,Q6T --shapes 151936x2048,14336x4096,4096x14336,6144x4096,4096x2048 \
  --pdl --qx --no-act-quant --compile-workers 8 --json $R/gemv_pdl.json > $R/gemv_pdl.log 2>&1
log "gemv pdl rc $?"
timeout 45 python3 bench/gemv_tiles_bench.py --types Q6T --shapes 14336x4096,4096x14336,6144x4096 \
  --qx --no-act-quant --compile-workers 8 --json $R/gemv_q6t.json > $R/gemv_q6t.log 2>&1
log "gemv q6t rc $?"
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 60 python3 bench/moe_tiles_bench.py --defaults-only --types Q8_0,Q4_K,Q4_KX \
  --compile-workers 8 --json $R/moe.json > $R/moe.log 2>&1
log "moe rc $?"
wait $M; log "models $(ls -la $W/*.gguf | awk '{print $5}' | tr '\n' ' ')"
OUT=/tmp/sbs CUDA_GRAPHS=on TOKENS=128 STREAM=0 LLAMA_WAIT=120 timeout 150 bash bench/gpu_box/cuda_side_by_side.sh > /tmp/sbs.log 2>&1
log "sbs rc $?: $(grep resident /tmp/sbs/summary.md 2>/dev/null | tr '\n' ' ')"; cp /tmp/sbs/summary.md $R/sbs_summary.md 2>/dev/null
OUT=/tmp/sbs_gguf SPARKD_MOE_GATE_UP_LAYOUT=gguf QUANTS=Q4_K LLAMA=0 CUDA_GRAPHS=on TOKENS=128 STREAM=0 \
  timeout 60 bash bench/gpu_box/cuda_side_by_side.sh > /tmp/sbs_gguf.log 2>&1
log "sbs gguf gate/up rc $?: $(grep -m1 resident /tmp/sbs_gguf/summary.md 2>/dev/null)"; cp /tmp/sbs_gguf/summary.md $R/sbs_gguf_summary.md 2>/dev/null
for q in Q8_0 Q4_K; do
  (cd bench/gpu_box && timeout 60 python3 prefill_bench.py --model $W/q3-12-$q.gguf --tokens 512 \
    --variants ${PREFILL_VARIANTS:-last,int8} --profile "" --json $R/prefill_$q.json) > $R/prefill_$q.log 2>&1
  log "prefill $q rc $?: $(grep -E ' 512 tokens' $R/prefill_$q.log | tr -s ' ' | tr '\n' ';')"
  [ -x $W/llama-cuda/llama-bench ] && timeout 40 $W/llama-cuda/llama-bench -m $W/q3-12-$q.gguf -ngl 99 -p 512 -n 0 -r 3 \
    -o json > $R/llama_pp_$q.json 2> $R/llama_pp_$q.err
  log "llama pp512 $q rc $?: $(grep -m1 avg_ts $R/llama_pp_$q.json 2>/dev/null)"
done
log done; cp $OUT/log.txt $R/
tar czf $OUT/res.tgz -C /tmp res sbs sbs_gguf sbs.log sbs_gguf.log build.log make.log 2>/dev/null
