#!/usr/bin/env bash
# The one device call of branch stream9 (H200): the streaming model written while the GPU tests of
# the eager step run, then the engine's streaming run without a VRAM cache (--unified on), the
# eager step as before this branch first (SPARKD_EAGER_STEP=none), then with its cuts (the
# default), each with its own disk bench; no llama.cpp. Run from the repo root; OUT set.
set -u
export PYTHONUNBUFFERED=1
W=/var/tmp/sparkd-cuda; mkdir -p "$W"
SM=$W/q3-stream-10G.gguf
T0=$(date +%s)
( [ -f "$SM" ] || { nice -n 10 python3 -m sparkd.engine.cli make-model "$SM.part" --preset qwen3-30b-a3b \
    --quant Q8_0 --quiet --size 10G && mv "$SM.part" "$SM"; }; echo "model ready at +$(( $(date +%s) - T0 ))s" ) > "$OUT/make.log" 2>&1 & M=$!
timeout 45 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/streaming/test_eager_step.py \
  "tests/engine/streaming/test_vram_cache.py::test_stage_profile_on_cuda_has_gpu_spans_and_equal_tables" \
  tests/engine/test_device_argmax.py > "$OUT/gpu_tests.txt" 2>&1
echo "rc=$? at +$(( $(date +%s) - T0 ))s" >> "$OUT/gpu_tests.txt"
wait $M
knobs=(LLAMA=0 QUANTS="" STREAM_TOKENS=64 STREAM_TIMEOUT=45 DISK_BLOCKS=1M DISK_DEPTHS=8 DISK_SECONDS=1 STREAM_VRAM_BUDGETS=0)
env "${knobs[@]}" SPARKD_EAGER_STEP=none OUT="$OUT/before" bash bench/gpu_box/cuda_side_by_side.sh > "$OUT/before.txt" 2>&1
env "${knobs[@]}" OUT="$OUT/after" bash bench/gpu_box/cuda_side_by_side.sh > "$OUT/after.txt" 2>&1
echo "done at +$(( $(date +%s) - T0 ))s" >> "$OUT/make.log"
