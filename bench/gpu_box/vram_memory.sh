#!/usr/bin/env bash
# Does the host side of the plan hold on CUDA, the trunk load included? The 2-layer
# qwen3-30b-a3b-shaped model (1.85 GiB, Q8_0; its f32 token embedding is 1.2 GiB) decoded with
# --device cuda inside a cgroup with memory.max=LIMIT enforced (the engine's budget is derived from
# it), for each LIMIT in LIMITS and --unified auto (VRAM cache) and on (zero-copy): memory.stat
# anon/file sampled every 0.1 s, memory.peak and oom kills, compared with the plan's host total
# (memory_summary.py, one JSON line per run). The trunk load alone: bench/load_memory.py (anon
# RSS sampled every 2 ms around load_model on cuda, the staging buffer against the built network).
# The GPU tests of the staged load and the VRAM cache run first. 4G is the earlier measurement's
# limit (load peaked at 3.27 GB anon, 1.0-1.5 GB over the steady state); 2560M is below that peak,
# and the old plan (staging = 2 x the trunk) refused to start there.
# Knobs: LIMITS="4G 2560M" TOKENS=32 OUT=/tmp/out WORK=/var/tmp/sparkd-vram
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; WORK=${WORK:-/var/tmp/sparkd-vram}; mkdir -p "$WORK"
LIMITS=${LIMITS:-4G 2560M}; TOKENS=${TOKENS:-32}
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/engine/streaming/test_device_staging.py \
  tests/engine/streaming/test_vram_cache.py tests/engine/test_kernel_engine.py -k "vram or zero_copy or staging or cuda_load" \
  > "$OUT/tests.log" 2>&1
grep -E "passed|failed|error|vram cuda|zero-copy|cuda: host peak" "$OUT/tests.log" | tail -8
M=$WORK/q30-2l.gguf
timeout 60 python3 -m sparkd.engine.cli make-model "$M" --preset qwen3-30b-a3b --layers 2 --quant Q8_0 --quiet --force
sync
echo "trunk load alone (cuda): $(timeout 60 python3 bench/load_memory.py "$M" --device cuda | tee "$OUT/load_cuda.json")"
CG_ROOT=/sys/fs/cgroup; [ -f $CG_ROOT/cgroup.controllers ] || CG_ROOT=/sys/fs/cgroup/unified
echo "+memory" > "$CG_ROOT/cgroup.subtree_control" 2>/dev/null || true
for LIMIT in $LIMITS; do
  for U in auto on; do
    CG=$CG_ROOT/sparkd-vram-mem-$U-$LIMIT; mkdir -p "$CG"; R=$OUT/${LIMIT}_$U
    echo "$(numfmt --from=iec "$LIMIT")" > "$CG/memory.max"; echo 0 > "$CG/memory.swap.max" 2>/dev/null
    sync; echo 3 > /proc/sys/vm/drop_caches
    (while sleep 0.1; do awk -v t="$(date +%s.%N)" '$1=="anon"||$1=="file"||$1=="shmem"{printf "%s %s=%s ", t, $1, $2} END{print ""}' "$CG/memory.stat"; done) > "$R.stat" & S=$!
    timeout 100 bash -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$CG" python3 -m sparkd.engine.cli generate "$M" \
      --tokens 1,2,3,4,5,6,7,8 -n "$TOKENS" --ctx 1024 --device cuda --unified $U --json > "$R.json" 2> "$R.err"
    RC=$?; kill $S
    echo "memory.max $LIMIT --unified $U: rc $RC decode $(grep -o '"decode_tok_s": [0-9.]*' "$R.json")"
    python3 bench/gpu_box/memory_summary.py --label "${LIMIT}_$U" --err "$R.err" --stat "$R.stat" \
      --peak "$(cat "$CG/memory.peak")" --events "$CG/memory.events" | tee "$R.summary.json"
    [ $RC -eq 0 ] || tail -5 "$R.err"
    rmdir "$CG"
  done
done
