#!/usr/bin/env bash
# Issue 8 in ONE device call (H200; carry [".whl", ".cache"]; about 400 s with the defaults): the
# llama.cpp CUDA build and the three models (12-layer Q8_0 and Q4_K, a 10G streaming one) start in
# the background; meanwhile the GPU tests (TESTS) and the 12-layer Q8_0 profile (decode_profile.py:
# kernels and GPU time per kernel of a graph replay) run; then cuda_side_by_side.sh (resident
# Q8_0/Q4_K with CUDA graphs vs llama-bench -ngl 99, streaming at memory.max 3G once per VRAM
# expert cache size of STREAM_VRAM_BUDGETS, llama.cpp mmap once).
# Usage: TESTS="tests/engine/test_x.py ..." bash bench/gpu_box/issue8_call.sh
# Knobs: TESTS (pytest files or node ids; none: no tests), TEST_MARK=gpu (pytest -m; empty: every test
#        of the files), TEST_K (pytest -k expression), TEST_TIMEOUT=200,
#        TEST_LOG=gpu_tests ($OUT/<name>.log), TESTS_ALONGSIDE=0 (1: the tests run in the background
#        while the GEMV and MoE benches run: their time is compiling on the CPU),
#        DRAW_GRAPH=0 (1: bench/gpu_box/draw_graph_bench.py, the sampling draw graph alone, before the tests),
#        GEMV (bench/gemv_tiles_bench.py arguments, e.g. "--types Q4T --shapes 151936x2048
#        --no-act-quant"; none: no bench) with GEMV_NAME=gemv_tiles ($OUT/<name>.json and .log) and
#        GEMV_TIMEOUT=80,
#        MOE (bench/moe_tiles_bench.py arguments, e.g. "--compile-workers 15 --defaults-only"; none: no
#        bench) with MOE_NAME=moe_tiles ($OUT/<name>.json and .log) and MOE_TIMEOUT=135,
#        SAMPLING=0 (1: bench/gpu_box/sampling_bench.py, greedy vs temperature 0.8 on the host and on the
#        device, on the 12-layer Q8_0 model with SAMPLING_EXPERTS experts per layer: empty, the preset's
#        128 (PROFILE's model, minutes to make); 8, a 1.29 GiB model made within a short call),
#        SAMPLING_TOKENS=128, SAMPLING_TIMEOUT=60,
#        PROFILE=1, SBS=1 (the side by side; it alone builds llama.cpp and makes the Q4_K and 10G models),
#        KSB=1 (bench/gpu_box/kernel_select_bench.py --device cuda: streaming's per-layer table cost),
#        SWITCHES=0 (1: decode_switches.py, the decode step with session 5's cuts off and on, on a
#        SWITCH_LAYERS=2-layer Q8_0 model made in the background, SWITCH_TOKENS=128 timed),
#        FUSION_DIFF=0 (1: rms_norm_fusion_diff.py, the norm with and without FP fusion),
#        STREAM_TOKENS=64, STREAM_VRAM_BUDGETS="auto 0 1G 2G" (auto: the default VRAM cache; 0: none,
#        zero-copy), LLAMA_STREAM_TOKENS=16 (llama.cpp mmap makes ~0.3 tok/s), STREAM_TIMEOUT=90 (per engine
#        run), LLAMA_STREAM_TIMEOUT=150;
#        results under $OUT (8 files at most come back).
# A short kernel call turns the long parts off, e.g. (Q6_K's integer step, session 5, branch q6k8):
#   PROFILE=0 KSB=0 SBS=0 GEMV="--types Q6_K --shapes 151936x2048,4096x2048,2048x768 --no-act-quant
#   --moe-q6k" GEMV_NAME=q6k_h200_s5 TESTS="tests/engine/test_q6_k_int.py ..." TEST_K="Q6_K or q6_k"
#   bash bench/gpu_box/issue8_call.sh
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
export PATH=$PATH:/usr/local/cuda/bin
W=${W:-/var/tmp/sparkd-cuda}; mkdir -p $W  # models kept between calls while the box stays warm
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
log "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1)"
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b --quant $2 --quiet "${@:3}" && mv $1.part $1; }; }
MAKES=(); MAKE_LOGS=()  # background model makes of this call, and their logs
if [ "${SBS:-1}" = 1 ]; then
  (OUT=/tmp/bo BUILD_ONLY=1 nice -n 19 setsid bash bench/gpu_box/cuda_side_by_side.sh > /tmp/build.log 2>&1 &)
  mk $W/q3-12-Q4_K.gguf Q4_K --layers 12 > /tmp/make2.log 2>&1 & MAKES+=($!); MAKE_LOGS+=(/tmp/make2.log)
  mk $W/q3-stream-10G.gguf Q8_0 --size 10G > /tmp/make3.log 2>&1 & MAKES+=($!); MAKE_LOGS+=(/tmp/make3.log)
fi
E=${SAMPLING_EXPERTS:-}
if [ "${SBS:-1}" = 1 ] || [ "${PROFILE:-1}" = 1 ] || { [ "${SAMPLING:-0}" = 1 ] && [ -z "$E" ]; }; then
  mk $W/q3-12-Q8_0.gguf Q8_0 --layers 12 > /tmp/make1.log 2>&1 & MAKES+=($!); MAKE_LOGS+=(/tmp/make1.log)
fi
SM=$W/q3-12${E:+-e$E}-Q8_0.gguf  # the sampling bench's model
if [ "${SAMPLING:-0}" = 1 ] && [ -n "$E" ]; then
  mk $SM Q8_0 --layers 12 --experts $E > /tmp/make5.log 2>&1 & MAKES+=($!); MAKE_LOGS+=(/tmp/make5.log)
fi
L=${SWITCH_LAYERS:-2}
if [ "${SWITCHES:-0}" = 1 ]; then
  mk $W/q30-${L}l-Q8_0.gguf Q8_0 --layers $L > /tmp/make4.log 2>&1 & MAKES+=($!); MAKE_LOGS+=(/tmp/make4.log)
fi
MARK=${TEST_MARK-gpu}
tests() {
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider ${MARK:+-m "$MARK"} -rfE \
    ${TEST_K:+-k "$TEST_K"} $TESTS \
    > $OUT/${TEST_LOG:-gpu_tests}.log 2>&1
  log "tests rc $? $(tail -1 $OUT/${TEST_LOG:-gpu_tests}.log)"
}
if [ "${DRAW_GRAPH:-0}" = 1 ]; then
  timeout 12 python3 bench/gpu_box/draw_graph_bench.py --json $OUT/draw_graph.json > $OUT/draw_graph.txt 2>&1
  log "draw graph rc $?"
fi
if [ -n "${TESTS:-}" ]; then
  log "gpu tests"
  if [ "${TESTS_ALONGSIDE:-0}" = 1 ]; then tests & TP=$!; else tests; fi
fi
if [ -n "${GEMV:-}" ]; then
  G=$OUT/${GEMV_NAME:-gemv_tiles}
  PYTHONPATH=$PYTHONPATH:$PWD/bench timeout ${GEMV_TIMEOUT:-80} python3 bench/gemv_tiles_bench.py $GEMV --json $G.json > $G.log 2>&1
  log "gemv bench rc $?: $(tail -1 $G.log)"
fi
if [ -n "${MOE:-}" ]; then
  M=$OUT/${MOE_NAME:-moe_tiles}
  PYTHONPATH=$PYTHONPATH:$PWD/bench timeout ${MOE_TIMEOUT:-135} python3 bench/moe_tiles_bench.py $MOE --json $M.json > $M.log 2>&1
  log "moe bench rc $?: $(tail -1 $M.log)"
fi
[ -n "${TP:-}" ] && wait $TP
if [ "${FUSION_DIFF:-0}" = 1 ]; then
  timeout 15 python3 bench/gpu_box/rms_norm_fusion_diff.py > $OUT/fusion_diff.txt 2>&1
  log "fusion diff rc $?: $(head -1 $OUT/fusion_diff.txt)"
fi
if [ "${PROFILE:-1}" = 1 ]; then
  while [ ! -f $W/q3-12-Q8_0.gguf ]; do sleep 2; done
  ln -sf $W/q3-12-Q8_0.gguf /tmp/q30-12l-Q8_0.gguf
  timeout 120 python3 bench/gpu_box/decode_profile.py --quant Q8_0 --layers 12 --tokens 32 --profile-tokens 8 --json /tmp/profile_q8.json > $OUT/profile_q8.txt 2>&1
  log "profile rc $?: $(grep -E 'graphs [0-9.]+ tok/s|graph replay:' $OUT/profile_q8.txt | tr '\n' ' ')"
fi
if [ "${SAMPLING:-0}" = 1 ]; then
  while [ ! -f $SM ]; do sleep 2; done
  timeout ${SAMPLING_TIMEOUT:-60} python3 bench/gpu_box/sampling_bench.py --model $SM --tokens ${SAMPLING_TOKENS:-128} \
    --json $OUT/sampling.json > $OUT/sampling.txt 2>&1
  log "sampling bench rc $?"
fi
if [ "${KSB:-1}" = 1 ]; then  # host time of the streaming kernel table per layer, by SPARKD_STREAM_TABLE mode
  timeout 90 python3 bench/gpu_box/kernel_select_bench.py --device cuda > /tmp/ksb.txt 2>&1  # 8 files come back: into log.txt
  log "kernel_select bench rc $?: $(grep -o "vram_slots=.*per kernel_select" /tmp/ksb.txt | tr "\n" " ") $(tail -1 /tmp/ksb.txt)"
fi
if [ "${SWITCHES:-0}" = 1 ]; then
  while [ ! -f $W/q30-${L}l-Q8_0.gguf ]; do sleep 2; done
  timeout 60 python3 bench/gpu_box/decode_switches.py --quant Q8_0 --layers $L --dir $W --tokens ${SWITCH_TOKENS:-128} \
    --profile-tokens 8 --json $OUT/switches.json > $OUT/switches.txt 2>&1
  log "switches rc $?"
fi
[ ${#MAKES[@]} -gt 0 ] && { wait "${MAKES[@]}"; log "models: $(tail -qn1 "${MAKE_LOGS[@]}" | tr '\n' ' ')"; }
if [ "${SBS:-1}" = 1 ]; then
  OUT=$OUT/sbs CUDA_GRAPHS=on TOKENS=128 STREAM_TOKENS=${STREAM_TOKENS:-64} STREAM_TIMEOUT=${STREAM_TIMEOUT:-90} \
    STREAM_VRAM_BUDGETS=${STREAM_VRAM_BUDGETS-auto 0 1G 2G} LLAMA_STREAM_TOKENS=${LLAMA_STREAM_TOKENS:-16} \
    LLAMA_STREAM_TIMEOUT=${LLAMA_STREAM_TIMEOUT:-150} bash bench/gpu_box/cuda_side_by_side.sh > $OUT/sbs.log 2>&1
  log "sbs rc $?"
fi
cp /tmp/profile_q8.json $OUT/ 2>/dev/null
log done
