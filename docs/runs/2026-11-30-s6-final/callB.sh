#!/usr/bin/env bash
# Session 6 final measuring call (H200, carry [".whl", ".cache", ".xfer/lead"]): llama.cpp's CUDA
# build and the three models start in the background; while they run, the GPU tests of the files
# changed after call A, then the GPU-side benches (final
# GEMV and MoE tiles, x pre-quantized as the engine runs them); then the sampling bench and the
# 12-layer profile; then the resident side by side vs llama-bench; then streaming at memory.max 3G,
# no VRAM cache, alternating SPARKD_EAGER_STEP=none and the default twice each (one disk bound per run).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
(OUT=/tmp/bo BUILD_ONLY=1 nice -n 5 setsid bash bench/gpu_box/cuda_side_by_side.sh > /tmp/build.log 2>&1 &)
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet "${@:3}" && mv $1.part $1; }; }
(mk $W/q3-12-Q8_0.gguf Q8_0 --layers 12; mk $W/q3-12-Q4_K.gguf Q4_K --layers 12; mk $W/q3-stream-10G.gguf Q8_0 --size 10G) > /tmp/make.log 2>&1 & M=$!
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_row_tiles.py tests/engine/test_device_argmax.py \
  tests/engine/test_device_sampler.py tests/engine/test_moe_tiles.py tests/engine/test_moe_decode_fusion.py \
  tests/engine/test_q4_k_tiled.py tests/engine/test_q6_k_tiled.py tests/engine/streaming/test_eager_step.py > $OUT/gpu_tests.log 2>&1
log "tests rc $? $(tail -1 $OUT/gpu_tests.log)"
timeout 110 python3 bench/gemv_tiles_bench.py --types Q8_0P,Q4T,Q6T --shapes 151936x2048,14336x4096,4096x14336,6144x4096,4096x2048 \
  --defaults-only --qx --no-act-quant --compile-workers 6 --json /tmp/gemv.json > $OUT/gemv_final.log 2>&1
log "gemv rc $?"
timeout 110 python3 bench/moe_tiles_bench.py --defaults-only --compile-workers 6 --json /tmp/moe.json > $OUT/moe_final.log 2>&1
log "moe rc $?"
while [ ! -f $W/q3-12-Q8_0.gguf ]; do sleep 2; done
timeout 60 python3 bench/gpu_box/sampling_bench.py --model $W/q3-12-Q8_0.gguf --tokens 128 --json /tmp/sampling.json > $OUT/sampling.txt 2>&1
log "sampling rc $?"
ln -sf $W/q3-12-Q8_0.gguf /tmp/q30-12l-Q8_0.gguf
timeout 90 python3 bench/gpu_box/decode_profile.py --quant Q8_0 --layers 12 --tokens 32 --profile-tokens 8 > $OUT/profile_q8.txt 2>&1
log "profile rc $?: $(grep -E 'graphs [0-9.]+ tok/s|graph replay:' $OUT/profile_q8.txt | tr '\n' ' ')"
wait $M; log "models $(ls -la $W/*.gguf | awk '{print $5}' | tr '\n' ' ')"
OUT=/tmp/sbs CUDA_GRAPHS=on TOKENS=128 STREAM=0 bash bench/gpu_box/cuda_side_by_side.sh > /tmp/sbs.log 2>&1
log "sbs rc $?"; cp /tmp/sbs/summary.md $OUT/sbs_summary.md 2>/dev/null
for run in none:1 default:1 none:2 default:2; do
  step=${run%:*}; [ $step = default ] && unset SPARKD_EAGER_STEP || export SPARKD_EAGER_STEP=none
  OUT=/tmp/alt/$step$((${run#*:})) LLAMA=0 QUANTS="" STREAM_TOKENS=64 STREAM_TIMEOUT=45 DISK_BLOCKS=1M DISK_DEPTHS=8 \
    DISK_SECONDS=1 STREAM_VRAM_BUDGETS=0 bash bench/gpu_box/cuda_side_by_side.sh > /tmp/alt_$step${run#*:}.log 2>&1
  log "stream $run rc $?: $(grep -m1 -E 'tok/s' /tmp/alt/$step${run#*:}/summary.md 2>/dev/null)"
done
unset SPARKD_EAGER_STEP
cp /tmp/gemv.json /tmp/moe.json /tmp/sampling.json /tmp/sbs/ 2>/dev/null
tar czf $OUT/raw.tgz -C /tmp sbs alt sbs.log alt_none1.log alt_default1.log 2>/dev/null
log done
