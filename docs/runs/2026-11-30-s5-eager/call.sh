#!/usr/bin/env bash
# The one device call of branch eager7 (H200): the streaming model written while the GPU tests of
# the eager decode kernels run, then the engine's streaming runs only (no llama.cpp), the eager
# step's torch attention first (SPARKD_FUSED_EAGER=0: the step before this branch), then the
# decode kernels (the default), each with its own disk bench. Run from the repo root; OUT set.
set -u
export PYTHONUNBUFFERED=1
W=/var/tmp/sparkd-cuda; mkdir -p "$W"
SM=$W/q3-stream-10G.gguf
( [ -f "$SM" ] || { nice -n 10 python3 -m sparkd.engine.cli make-model "$SM.part" --preset qwen3-30b-a3b \
    --quant Q8_0 --quiet --size 10G && mv "$SM.part" "$SM"; } ) > "$OUT/make.log" 2>&1 & M=$!
timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_eager_decode.py > "$OUT/gpu_tests.txt" 2>&1
echo "rc=$?" >> "$OUT/gpu_tests.txt"
wait $M
knobs=(LLAMA=0 QUANTS="" STREAM_TOKENS=64 DISK_BLOCKS=1M DISK_DEPTHS=8 DISK_SECONDS=1)
env "${knobs[@]}" SPARKD_FUSED_EAGER=0 STREAM_VRAM_BUDGETS="0" OUT="$OUT/before" bash bench/gpu_box/cuda_side_by_side.sh > "$OUT/before.txt" 2>&1
env "${knobs[@]}" STREAM_VRAM_BUDGETS="0 2G" OUT="$OUT/after" bash bench/gpu_box/cuda_side_by_side.sh > "$OUT/after.txt" 2>&1
