#!/usr/bin/env bash
# Does the host side of the plan hold on CUDA? The 2-layer qwen3-30b-a3b-shaped model (1.85 GiB,
# Q8_0) decoded with --device cuda inside a cgroup with memory.max=LIMIT enforced (the engine's
# budget is derived from it), VRAM cache (auto) and zero-copy (on); memory.stat anon/file sampled
# every 0.5 s, memory.peak and oom kills recorded. The GPU tests of the VRAM cache run first.
# Knobs: LIMIT=4G TOKENS=32 OUT=/tmp/out WORK=/var/tmp/sparkd-vram
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; WORK=${WORK:-/var/tmp/sparkd-vram}; mkdir -p "$WORK"
LIMIT=${LIMIT:-4G}; TOKENS=${TOKENS:-32}
export PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/engine/streaming/test_vram_cache.py \
  tests/engine/test_kernel_engine.py -k "vram or zero_copy" > "$OUT/tests.log" 2>&1
grep -E "passed|failed|error|vram cuda|zero-copy" "$OUT/tests.log" | tail -6
M=$WORK/q30-2l.gguf
timeout 60 python3 -m sparkd.engine.cli make-model "$M" --preset qwen3-30b-a3b --layers 2 --quant Q8_0 --quiet --force
CG_ROOT=/sys/fs/cgroup; [ -f $CG_ROOT/cgroup.controllers ] || CG_ROOT=/sys/fs/cgroup/unified
echo "+memory" > "$CG_ROOT/cgroup.subtree_control" 2>/dev/null || true
for U in auto on; do
  CG=$CG_ROOT/sparkd-vram-mem-$U; mkdir -p "$CG"
  echo "$(numfmt --from=iec "$LIMIT")" > "$CG/memory.max"; echo 0 > "$CG/memory.swap.max" 2>/dev/null
  sync; echo 3 > /proc/sys/vm/drop_caches
  (while sleep 0.5; do awk -v t="$(date +%s.%N)" '$1=="anon"||$1=="file"||$1=="shmem"{printf "%s %s=%s ", t, $1, $2} END{print ""}' "$CG/memory.stat"; done) > "$OUT/stat_$U.txt" & S=$!
  timeout 100 bash -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$CG" python3 -m sparkd.engine.cli generate "$M" \
    --tokens 1,2,3,4,5,6,7,8 -n "$TOKENS" --ctx 1024 --device cuda --unified $U --json > "$OUT/gen_$U.json" 2> "$OUT/gen_$U.err"
  RC=$?; kill $S
  echo "--unified $U: rc $RC memory.max $(cat $CG/memory.max) memory.peak $(cat $CG/memory.peak) $(grep oom_kill $CG/memory.events | tr '\n' ' ')"
  echo "  max anon $(grep -o 'anon=[0-9]*' "$OUT/stat_$U.txt" | cut -d= -f2 | sort -n | tail -1) max file $(grep -o 'file=[0-9]*' "$OUT/stat_$U.txt" | cut -d= -f2 | sort -n | tail -1)"
  grep -E "budget|runtime|expert cache|total" "$OUT/gen_$U.err" | head -6; tail -c 200 "$OUT/gen_$U.json"; echo
  rmdir "$CG"
done
