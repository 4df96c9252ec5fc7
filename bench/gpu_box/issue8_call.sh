#!/usr/bin/env bash
# Issue 8 in ONE device call (H200; carry [".whl", ".cache"]; about 400 s): the llama.cpp CUDA
# build and the three models (12-layer Q8_0 and Q4_K, a 10G streaming one) start in the
# background; meanwhile the GPU tests (TESTS) and the 12-layer Q8_0 profile (decode_profile.py:
# kernels and GPU time per kernel of a graph replay) run; then cuda_side_by_side.sh (resident
# Q8_0/Q4_K with CUDA graphs vs llama-bench -ngl 99, streaming at memory.max 3G once per VRAM
# expert cache size of STREAM_VRAM_BUDGETS, llama.cpp mmap once).
# Usage: TESTS="tests/engine/test_x.py ..." bash bench/gpu_box/issue8_call.sh
# Knobs: TESTS (pytest -m gpu files; none: no tests), TEST_TIMEOUT=200, PROFILE=1, SBS=1,
#        KSB=1 (bench/gpu_box/kernel_select_bench.py --device cuda: streaming's per-layer table cost),
#        STREAM_TOKENS=64, STREAM_VRAM_BUDGETS="auto 0 1G 2G" (auto: the default VRAM cache; 0: none,
#        zero-copy), LLAMA_STREAM_TOKENS=16 (llama.cpp mmap makes ~0.3 tok/s), STREAM_TIMEOUT=90 (per engine
#        run), LLAMA_STREAM_TIMEOUT=150;
#        results under $OUT (8 files at most come back).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
export PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
(OUT=/tmp/bo BUILD_ONLY=1 nice -n 19 setsid bash bench/gpu_box/cuda_side_by_side.sh > /tmp/build.log 2>&1 &)
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet "${@:3}" && mv $1.part $1; }; }
mk $W/q3-12-Q8_0.gguf Q8_0 --layers 12 > /tmp/make1.log 2>&1 & M1=$!
mk $W/q3-12-Q4_K.gguf Q4_K --layers 12 > /tmp/make2.log 2>&1 & M2=$!
mk $W/q3-stream-10G.gguf Q8_0 --size 10G > /tmp/make3.log 2>&1 & M3=$!
if [ -n "${TESTS:-}" ]; then
  log "gpu tests"
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $TESTS > $OUT/gpu_tests.log 2>&1
  log "tests rc $? $(tail -1 $OUT/gpu_tests.log)"
fi
while [ ! -f $W/q3-12-Q8_0.gguf ]; do sleep 2; done
if [ "${PROFILE:-1}" = 1 ]; then
  ln -sf $W/q3-12-Q8_0.gguf /tmp/q30-12l-Q8_0.gguf
  timeout 120 python3 bench/gpu_box/decode_profile.py --quant Q8_0 --layers 12 --tokens 32 --profile-tokens 8 --json /tmp/profile_q8.json > $OUT/profile_q8.txt 2>&1
  log "profile rc $?: $(grep -E 'graphs [0-9.]+ tok/s|graph replay:' $OUT/profile_q8.txt | tr '\n' ' ')"
fi
if [ "${KSB:-1}" = 1 ]; then  # host time of the streaming kernel table per layer, by SPARKD_STREAM_TABLE mode
  timeout 90 python3 bench/gpu_box/kernel_select_bench.py --device cuda > /tmp/ksb.txt 2>&1  # 8 files come back: into log.txt
  log "kernel_select bench rc $?: $(grep -o "vram_slots=.*per kernel_select" /tmp/ksb.txt | tr "\n" " ") $(tail -1 /tmp/ksb.txt)"
fi
wait $M1 $M2 $M3; log "models: $(tail -qn1 /tmp/make?.log | tr '\n' ' ')"
[ "${SBS:-1}" = 1 ] && OUT=$OUT/sbs CUDA_GRAPHS=on TOKENS=128 STREAM_TOKENS=${STREAM_TOKENS:-64} STREAM_TIMEOUT=${STREAM_TIMEOUT:-90} \
  STREAM_VRAM_BUDGETS=${STREAM_VRAM_BUDGETS-auto 0 1G 2G} LLAMA_STREAM_TOKENS=${LLAMA_STREAM_TOKENS:-16} \
  LLAMA_STREAM_TIMEOUT=${LLAMA_STREAM_TIMEOUT:-150} bash bench/gpu_box/cuda_side_by_side.sh > $OUT/sbs.log 2>&1
log "sbs rc $?"
cp /tmp/profile_q8.json $OUT/ 2>/dev/null
log done
