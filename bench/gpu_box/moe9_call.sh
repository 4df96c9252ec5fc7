#!/bin/bash
# Session 6 (branch moe9): the MoE decode at large-model shapes, old (session 4) / s5 / default
# (session 6: Q8_0 words, the gate+up loop, WIDTH_TIERS) whole calls and launches, then the GPU
# tests. SWEEP=1 times the candidates too (call 1); unset: the three tile sets only (call 2).
# Run from the repo root (or .xfer/moe9) on the device box after the wheel install; $OUT collects the logs.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
L=$OUT/moe_tiles_h200_s6.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$L"
t0=$(date +%s)
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout "${BENCH_S:-135}" python3 bench/moe_tiles_bench.py --compile-workers 15 \
    $([ -n "${SWEEP:-}" ] || echo --defaults-only) --json "$OUT/moe_tiles_h200_s6.json" >> "$L" 2>&1
echo "bench rc=$? wall=$(( $(date +%s) - t0 )) s" >> "$L"
T=$OUT/moe_tiles_h200_s6_tests.log
timeout "${TESTS_S:-60}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_moe_tiles.py \
    tests/engine/test_kernel_determinism.py > "$T" 2>&1
echo "tests rc=$? wall=$(( $(date +%s) - t0 )) s" >> "$T"
tail -3 "$T"
