#!/usr/bin/env bash
# Expert streaming vs llama.cpp mmap on the GPU box, in ONE call of under 8 minutes (16 cores, NVMe;
# the box is bare at every start and has no internet):
#   1. in the background: llama.cpp CPU build (llama-bench only, -j$(nproc)) from the vendored
#      llama-cpp-python 0.3.36 sdist carried as .cache/ (the same source as the numeric oracle);
#   2. a Qwen3-30B-A3B-shaped qwen3moe Q8_0 GGUF of MODEL_SIZE, generated (make-model);
#   3. sparkctl disk-bench on it: the O_DIRECT bound;
#   4. sparkd-engine generate in a cgroup v2 per budget of BUDGETS (memory.max = budget; the engine
#      derives its budget from memory.max): decode tok/s, bytes/token, bandwidth while misses were
#      outstanding, per-stage profile; memory.stat file bytes sampled (must stay flat), memory.peak;
#   5. llama-bench mmap'ing the same GGUF in a cgroup with the first budget's memory.max
#      (-lm mmap --repack 0: repacking would copy the weights into anonymous memory);
#   6. a side-by-side table (summary.md) and each step's wall time (steps.txt).
# Where the memory controller is missing (a hybrid cgroup host) the limits cannot be enforced: the
# script says so, passes --budget instead and still runs everything (a dry run with a small model).
# Expects python3 with torch, numpy and gguf; cmake and a C++ compiler; the sdist at $SDIST.
# Usage (lead, device tool with carry [".cache"]): bash bench/gpu_box/streaming_bench.sh
# Knobs: MODEL_SIZE=14G BUDGETS="4G 8G" PREFETCH=16 (an extra run at the first budget; 0: none)
#        TOKENS=8 LLAMA_TOKENS=8 CTX=1024 READ_THREADS=32 THREADS=$(nproc) OUT=... WORK=...
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/streaming-out}; mkdir -p "$OUT"
WORK=${WORK:-/var/tmp/sparkd-stream}; mkdir -p "$WORK"   # a real disk, not tmpfs
MODEL_SIZE=${MODEL_SIZE:-14G}; BUDGETS=${BUDGETS:-4G 8G}; TOKENS=${TOKENS:-8}; CTX=${CTX:-1024}
PREFETCH=${PREFETCH:-16}; LLAMA_TOKENS=${LLAMA_TOKENS:-8}; LLAMA_TIMEOUT=${LLAMA_TIMEOUT:-180}; GEN_TIMEOUT=${GEN_TIMEOUT:-240}
BLOCKS=${BLOCKS:-1M,4M}; DEPTHS=${DEPTHS:-16,64}; DISK_SECONDS=${DISK_SECONDS:-2}
JOBS=${JOBS:-$(nproc)}; THREADS=${THREADS:-$(nproc)}
READ_THREADS=${READ_THREADS:-32}  # reads in flight: the bound is measured at queue depth 16-64
SDIST=${SDIST:-.cache/llama_cpp_python-0.3.36.tar.gz}
LLAMA_BENCH=${LLAMA_BENCH:-}  # an already built llama-bench skips the build
PY=${PY:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # keep carried wheels
T_START=$(date +%s)
log() { echo "[$(date +%T) +$(( $(date +%s) - T_START ))s] $*" | tee -a "$OUT/log.txt"; }
step() { echo "$1 $2" >> "$OUT/steps.txt"; log "step $1 took $2 s"; }

# --- cgroup: the unified hierarchy, and whether it can enforce memory.max -------------------------
if [ -z "${CG_ROOT:-}" ]; then
  CG_ROOT=/sys/fs/cgroup; [ -f $CG_ROOT/cgroup.controllers ] || CG_ROOT=/sys/fs/cgroup/unified
fi
CG=$CG_ROOT/sparkd-stream-bench
echo "+memory +io" > "$CG_ROOT/cgroup.subtree_control" 2>/dev/null || \
  echo "+memory" > "$CG_ROOT/cgroup.subtree_control" 2>/dev/null || true
ENFORCED=0; grep -qw memory "$CG_ROOT/cgroup.subtree_control" 2>/dev/null && ENFORCED=1
if [ $ENFORCED = 1 ]; then log "cgroup $CG: memory.max enforced"
else log "WARNING: no memory controller under $CG_ROOT: memory.max is NOT enforced here; passing --budget instead (numbers are not the GPU box's)"; fi
cg_new() {  # a fresh cgroup (memory.peak starts at 0) limited to $1
  cg_remove; mkdir "$CG" 2>/dev/null || { log "WARNING: could not create $CG: running without a cgroup"; return 0; }
  if [ $ENFORCED = 1 ]; then echo "$(numfmt --from=iec "$1")" > "$CG/memory.max"; echo 0 > "$CG/memory.swap.max" 2>/dev/null || true; fi
}
cg_remove() { if [ -d "$CG" ]; then echo 1 > "$CG/cgroup.kill" 2>/dev/null || true; sleep 0.5; rmdir "$CG" 2>/dev/null || true; fi; }
in_cg() { bash -c 'if [ -d "$0" ]; then echo $$ > "$0/cgroup.procs"; fi; exec "$@"' "$CG" "$@"; }
in_cg_timeout() { local t=$1; shift; timeout "$t" bash -c 'if [ -d "$0" ]; then echo $$ > "$0/cgroup.procs"; fi; exec "$@"' "$CG" "$@"; }
cg_read() { cat "$CG/$1" 2>/dev/null || echo "n/a"; }
# bytes the cgroup read from disk (io controller), or n/a
io_rbytes() { if [ -r "$CG/io.stat" ]; then awk '{for(i=2;i<=NF;i++) if($i ~ /^rbytes=/){split($i,a,"="); s+=a[2]}} END{print s+0}' "$CG/io.stat"; else echo n/a; fi; }
io_delta() { local now; now=$(io_rbytes); if [ "$1" = n/a ] || [ "$now" = n/a ]; then echo n/a; else echo $(( now - $1 )); fi; }
sample_file_bytes() { while sleep 1; do echo "$(date +%s) $(awk '$1=="file"{print $2}' "$CG/memory.stat" 2>/dev/null)"; done; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || log "could not drop the page cache (not root?)"; }
# the budget the engine would derive from memory.max, passed explicitly where it is not enforced
budget_flag() { [ $ENFORCED = 1 ] && return 0; local n; n=$(numfmt --from=iec "$1")
  local h=$(( n / 20 )); [ $h -lt 268435456 ] && h=268435456; echo "--budget $(( n - h ))"; }
BUILD_PID=""
cleanup() { cg_remove; [ -n "$BUILD_PID" ] && kill "$BUILD_PID" 2>/dev/null || true; }
trap cleanup EXIT
: > "$OUT/steps.txt"
{ echo "host $(hostname) $(nproc) cores, $(awk '/MemTotal/{print $2/1048576 " GiB"}' /proc/meminfo), kernel $(uname -r)"
  echo "model $MODEL_SIZE, budgets $BUDGETS, tokens $TOKENS, ctx $CTX, threads $THREADS, read threads $READ_THREADS, memory.max enforced: $ENFORCED"; } > "$OUT/machine.txt"

# --- 1. llama.cpp build, in the background while the model is written --------------------------
build_llama() {
  local t0; t0=$(date +%s)
  local src=$WORK/llama-src b=$WORK/llama-build
  rm -rf "$src"; mkdir -p "$src"; tar -xf "$SDIST" -C "$src" --strip-components=1
  cmake -S "$src/vendor/llama.cpp" -B "$b" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF > "$OUT/llama_cmake.txt" 2>&1
  cmake --build "$b" -j"$JOBS" --target llama-bench > "$OUT/llama_build.txt" 2>&1
  echo "llama_build $(( $(date +%s) - t0 ))" >> "$OUT/steps.txt"
}
if [ -z "$LLAMA_BENCH" ]; then
  if [ -f "$SDIST" ]; then
    LLAMA_BENCH=$WORK/llama-build/bin/llama-bench
    build_llama & BUILD_PID=$!
    log "building llama-bench from $SDIST in the background (pid $BUILD_PID)"
  else log "no $SDIST: llama.cpp side by side skipped"; fi
fi

# --- 2. the model ---------------------------------------------------------------------------------
MODEL=$WORK/qwen3moe-$MODEL_SIZE.gguf
t0=$(date +%s)
if [ ! -f "$MODEL" ]; then
  log "writing $MODEL"
  rm -f "$MODEL.part"
  $PY -m sparkd.engine.cli make-model "$MODEL.part" --preset qwen3-30b-a3b --size "$MODEL_SIZE" --quant Q8_0 --quiet
  sync; mv "$MODEL.part" "$MODEL"  # flushed here, not in the first run's drop_caches
fi
$PY -m sparkd.engine.cli inspect "$MODEL" | tee -a "$OUT/log.txt"
step make_model $(( $(date +%s) - t0 ))

# --- 3. the bound ---------------------------------------------------------------------------------
t0=$(date +%s)
$PY -m sparkd.cli.sparkctl disk-bench "$MODEL" --block-sizes "$BLOCKS" --queue-depths "$DEPTHS" \
  --seconds "$DISK_SECONDS" --json --no-save > "$OUT/disk.json"
step disk_bench $(( $(date +%s) - t0 ))

# --- 4. sparkd-engine per budget ----------------------------------------------------------------
FIRST=${BUDGETS%% *}
RUNS=$BUDGETS; [ "$PREFETCH" -gt 0 ] && RUNS="$FIRST $FIRST-pf$PREFETCH ${BUDGETS#"$FIRST"}"
for RUN in $RUNS; do  # a run is a budget, or BUDGET-pfN: the same with N prefetch slots
  B=${RUN%-pf*}; PF=0; [ "$RUN" != "$B" ] && PF=${RUN##*-pf}
  t0=$(date +%s)
  cg_new "$B"; drop_caches
  log "sparkd-engine generate, memory.max=$B, prefetch $PF"
  in_cg $PY -m sparkd.engine.cli plan "$MODEL" --ctx "$CTX" --prefetch "$PF" $(budget_flag "$B") > "$OUT/plan_$RUN.txt" 2>&1 || true
  TRACE=(); [ "$RUN" = "$FIRST" ] && TRACE=(--trace "$OUT/trace.txt")
  sample_file_bytes > "$OUT/memory_stat_file_$RUN.txt" & SAMPLER=$!
  rb0=$(io_rbytes)
  OMP_NUM_THREADS=$THREADS in_cg_timeout "$GEN_TIMEOUT" \
    $PY -m sparkd.engine.cli generate "$MODEL" --tokens 1,2,3,4 -n "$TOKENS" --ctx "$CTX" --json \
    --prefetch "$PF" --read-threads "$READ_THREADS" $(budget_flag "$B") "${TRACE[@]}" > "$OUT/generate_$RUN.json" 2> "$OUT/generate_$RUN.err" \
    || log "generate $RUN failed: $(tail -3 "$OUT/generate_$RUN.err")"
  io_delta "$rb0" > "$OUT/io_rbytes_$RUN.txt"
  kill $SAMPLER; wait $SAMPLER 2>/dev/null || true
  cg_read memory.peak > "$OUT/memory_peak_$RUN.txt"; cg_read memory.max > "$OUT/memory_max_$RUN.txt"
  step "sparkd_$RUN" $(( $(date +%s) - t0 ))
done
$PY -m sparkd.engine.cli simulate-cache --trace "$OUT/trace.txt" --budget "$FIRST" > "$OUT/simulate.txt" 2>&1 || true

# --- 5. llama.cpp mmap in the same memory.max -----------------------------------------------------
if [ -n "$BUILD_PID" ]; then
  log "waiting for the llama.cpp build"; wait "$BUILD_PID" || log "llama.cpp build failed: $(tail -5 "$OUT/llama_build.txt")"
  BUILD_PID=""
fi
if [ -n "$LLAMA_BENCH" ] && [ -x "$LLAMA_BENCH" ]; then
  t0=$(date +%s)
  cg_new "$FIRST"; drop_caches
  log "llama-bench mmap, memory.max=$FIRST"
  sample_file_bytes > "$OUT/memory_stat_file_llama.txt" & SAMPLER=$!
  rb0=$(io_rbytes)
  in_cg_timeout "$LLAMA_TIMEOUT" \
    "$LLAMA_BENCH" -m "$MODEL" -p 0 -n "$LLAMA_TOKENS" -t "$THREADS" -r 1 -lm mmap --repack 0 -o json \
    > "$OUT/llama_bench.json" 2> "$OUT/llama_bench.err" || log "llama-bench failed or timed out ($LLAMA_TIMEOUT s): $(tail -3 "$OUT/llama_bench.err")"
  io_delta "$rb0" > "$OUT/io_rbytes_llama.txt"
  kill $SAMPLER; wait $SAMPLER 2>/dev/null || true
  cg_read memory.peak > "$OUT/memory_peak_llama.txt"
  step llama_bench $(( $(date +%s) - t0 ))
fi
cg_remove

# --- 6. the table ---------------------------------------------------------------------------------
$PY bench/gpu_box/streaming_summary.py "$OUT" "$LLAMA_TOKENS" $RUNS | tee "$OUT/summary.md"
log "total $(( $(date +%s) - T_START )) s"
