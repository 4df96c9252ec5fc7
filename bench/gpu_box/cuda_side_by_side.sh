#!/usr/bin/env bash
# sparkd-engine on CUDA vs llama.cpp built with CUDA from the same vendored source, side by side in
# ONE device call (H200 box: 16 cores, nvcc 13, cmake, ninja; no internet):
#   1. llama-bench with CUDA (GGML_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=90, static ggml, FlashAttention
#      kernels off), built from the vendored llama-cpp-python sdist in the background while the
#      models are written (182 s on the box; the binary, 27 MB packed, is too big to come back);
#   2. Qwen3-30B-A3B-shaped qwen3moe GGUFs (full 151936 vocabulary, LAYERS layers) in Q8_0 and Q4_K;
#   3. resident decode: `sparkd-engine generate --device cuda --resident` (each CUDA_GRAPHS mode the
#      engine knows) against `llama-bench -ngl 99` on the same file, same number of decode tokens;
#   4. streaming decode (STREAM_SIZE model, memory.max = STREAM_BUDGET, 3-4x smaller): the O_DIRECT
#      bound (`sparkctl disk-bench` on the model file), then sparkd on CUDA once per VRAM expert
#      cache size of STREAM_VRAM_BUDGETS (auto: the default, free device memory; 0: none, experts
#      read zero-copy from the pinned arena = --unified on; else --vram-budget SIZE) against
#      llama.cpp with experts mapped from the file in host memory (-ngl 99 --n-cpu-moe 99
#      --no-host 1 -lm mmap), each in its own cgroup, page cache dropped before each;
#   5. summary.md: one table of tok/s and ratios; the streaming table (bench/gpu_box/
#      streaming_summary.py --cuda): tok/s, bytes read per token, ratio to the cache-adjusted I/O
#      bound, read bandwidth while misses were outstanding / bound, VRAM and host-cache hit rates,
#      memory.peak, and the per-stage profile (host and GPU seconds).
# Usage (device tool, carry [".whl", ".cache"]): bash bench/gpu_box/cuda_side_by_side.sh
# Knobs: LAYERS=12 QUANTS="Q8_0 Q4_K" ("": no resident runs) TOKENS=128 STREAM_SIZE=10G STREAM_BUDGET=3G
#        STREAM_TOKENS=16 LLAMA_STREAM_TOKENS=$STREAM_TOKENS STREAM_VRAM_BUDGETS="auto 0 1G 2G" STREAM_ARGS="" (more generate flags for
#        every streaming run, e.g. "--prefetch 16") STREAM_FEED=bench/gpu_box/stream_tokens_s6.json (passed to every
#        sparkd streaming run as --feed-tokens: the same decoded tokens, hence the same experts read, whatever the
#        kernels' numerics; session 6's 64 greedy tokens for prompt 1..8, so more STREAM_TOKENS stop at 64; "": greedy, the continuation the run picks) DISK_BLOCKS=1M,4M DISK_DEPTHS=8,64 DISK_SECONDS=1.5
#        STREAM_TIMEOUT=120 (per engine streaming run) LLAMA_STREAM_TIMEOUT=$STREAM_TIMEOUT DEVICE=cuda (cpu: dry run) LLAMA_WAIT=900 (longest wait for the build) CUDA_GRAPHS="off on" (modes passed as --cuda-graphs; "" for an engine without the flag)
#        BUILD_ONLY=1 (build llama-bench, nothing else) LLAMA=0 (no llama.cpp build or runs) STREAM=0 (no streaming runs)
#        OUT=... WORK=...
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cuda-sbs}; mkdir -p "$OUT"
WORK=${WORK:-/var/tmp/sparkd-cuda}; mkdir -p "$WORK"
LAYERS=${LAYERS:-12}; QUANTS=${QUANTS-Q8_0 Q4_K}; TOKENS=${TOKENS:-128}
STREAM_SIZE=${STREAM_SIZE:-10G}; STREAM_BUDGET=${STREAM_BUDGET:-3G}; STREAM_TOKENS=${STREAM_TOKENS:-16}
STREAM_TIMEOUT=${STREAM_TIMEOUT:-120}; TIMEOUT=300; LLAMA_WAIT=${LLAMA_WAIT:-900}  # seconds per measured command (resident, streaming)
CUDA_GRAPHS=${CUDA_GRAPHS-off on}; BUILD_ONLY=${BUILD_ONLY:-0}; STREAM=${STREAM:-1}; LLAMA=${LLAMA:-1}
LLAMA_STREAM_TOKENS=${LLAMA_STREAM_TOKENS:-$STREAM_TOKENS}; LLAMA_STREAM_TIMEOUT=${LLAMA_STREAM_TIMEOUT:-$STREAM_TIMEOUT}
DEVICE=${DEVICE:-cuda}  # cpu: a dry run of the script's steps on a machine without a GPU
STREAM_VRAM_BUDGETS=${STREAM_VRAM_BUDGETS-auto 0 1G 2G}; STREAM_ARGS=${STREAM_ARGS:-}
STREAM_FEED=${STREAM_FEED-bench/gpu_box/stream_tokens_s6.json}  # llama.cpp's runs decode their own tokens
DISK_BLOCKS=${DISK_BLOCKS:-1M,4M}; DISK_DEPTHS=${DISK_DEPTHS:-8,64}; DISK_SECONDS=${DISK_SECONDS:-1.5}
SDIST=${SDIST:-.cache/llama_cpp_python-0.3.36.tar.gz}
PY=${PY:-python3}
[ -d /usr/local/cuda/bin ] && export PATH=$PATH:/usr/local/cuda/bin
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T_START=$(date +%s)
log() { echo "[$(date +%T) +$(( $(date +%s) - T_START ))s] $*" | tee -a "$OUT/log.txt"; }

# --- 1. llama-bench with CUDA ---------------------------------------------------------------------
# The build logs stay in $WORK so that a BUILD_ONLY=1 run started in the background (while the GPU
# tests run, say) and the measuring run share one build: the later run waits for $BUILDING.
LLAMA_BENCH=$WORK/llama-cuda/llama-bench; BUILDING=$WORK/llama-building
build_llama() {
  local t0 src=$WORK/llama-src b=$WORK/llama-build gen=()
  set +e; t0=$(date +%s); touch "$BUILDING"  # a failed step must still clear $BUILDING
  command -v ninja > /dev/null && gen=(-G Ninja)
  # FlashAttention kernels off: they are most of the build time; llama-bench then runs -fa 0
  { rm -rf "$src" && mkdir -p "$src" && tar -xf "$SDIST" -C "$src" --strip-components=1 \
    && cmake -S "$src/vendor/llama.cpp" -B "$b" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DBUILD_SHARED_LIBS=OFF \
      -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    && cmake --build "$b" -j"$(nproc)" --target llama-bench \
    && mkdir -p "$(dirname "$LLAMA_BENCH")" && cp "$b/bin/llama-bench" "$LLAMA_BENCH"; } > "$WORK/llama_build.txt" 2>&1
  echo "llama_build_seconds $(( $(date +%s) - t0 ))" > "$WORK/llama_build_seconds.txt"
  rm -f "$BUILDING"
}
BUILD_PID=""
if [ "$LLAMA" = 1 ] && [ ! -x "$LLAMA_BENCH" ] && [ ! -f "$BUILDING" ]; then
  build_llama & BUILD_PID=$!; log "building llama-bench with CUDA in the background (pid $BUILD_PID)"
fi
wait_build() {
  [ "$LLAMA" = 1 ] || { log "LLAMA=0: no llama.cpp runs"; return 0; }
  log "waiting for the llama.cpp CUDA build"
  [ -n "$BUILD_PID" ] && { wait "$BUILD_PID" || true; }
  local waited=0
  while [ -f "$BUILDING" ] && [ $waited -lt "$LLAMA_WAIT" ]; do sleep 2; waited=$(( waited + 2 )); done
  BUILD_PID=""; cp "$WORK"/llama_*.txt "$OUT/" 2>/dev/null || true
  if [ -x "$LLAMA_BENCH" ]; then log "llama-bench ready: $(cat "$WORK/llama_build_seconds.txt" 2>/dev/null)"
  elif [ -f "$BUILDING" ]; then log "llama.cpp build still running after ${LLAMA_WAIT}s: llama.cpp runs skipped"
  else log "llama.cpp build failed: $(tail -20 "$WORK/llama_build.txt" 2>/dev/null)"; fi
}
if [ "$BUILD_ONLY" = 1 ]; then wait_build; exit 0; fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1 || true

# --- 2. models --------------------------------------------------------------------------------------
make_model() {  # out quant [extra make-model args...]
  local out=$1 q=$2; shift 2
  [ -f "$out" ] && return 0
  $PY -m sparkd.engine.cli make-model "$out.part" --preset qwen3-30b-a3b --quant "$q" --quiet "$@"
  mv "$out.part" "$out"
}
for Q in $QUANTS; do make_model "$WORK/q3-$LAYERS-$Q.gguf" "$Q" --layers "$LAYERS"; done
SM=$WORK/q3-stream-$STREAM_SIZE.gguf  # written here too, while llama.cpp builds
[ "$STREAM" = 1 ] && make_model "$SM" Q8_0 --size "$STREAM_SIZE"
log "models written"

# --- 3. resident decode -------------------------------------------------------------------------------
wait_build
RUN=()  # a prefix for the measured commands (in_cg for the streaming runs)
engine_gen() {  # model mode tag [extra...]
  local m=$1 mode=$2 tag=$3; shift 3
  local flag=(); [ -n "$mode" ] && flag=(--cuda-graphs "$mode")
  "${RUN[@]}" timeout "$TIMEOUT" $PY -m sparkd.engine.cli generate "$m" --tokens 1,2,3,4,5,6,7,8 -n "$TOKENS" --device "$DEVICE" \
    --json "${flag[@]}" "$@" > "$OUT/engine_$tag.json" 2> "$OUT/engine_$tag.err" \
    || log "engine $tag failed: $(tail -3 "$OUT/engine_$tag.err")"
  log "engine $tag: $(grep -o '"decode_tok_s": [0-9.]*' "$OUT/engine_$tag.json" || true)"
}
llama() {  # tag args...
  local tag=$1; shift
  [ "$LLAMA" = 1 ] && [ -x "$LLAMA_BENCH" ] || { log "no llama-bench: $tag skipped"; return 0; }
  "${RUN[@]}" timeout "$TIMEOUT" "$LLAMA_BENCH" -o json "$@" > "$OUT/llama_$tag.json" 2> "$OUT/llama_$tag.err" \
    || log "llama-bench $tag failed: $(tail -3 "$OUT/llama_$tag.err")"
  log "llama $tag: $(grep -o '"avg_ts": [0-9.e+]*' "$OUT/llama_$tag.json" || true)"
}
for Q in $QUANTS; do
  M=$WORK/q3-$LAYERS-$Q.gguf
  for mode in ${CUDA_GRAPHS:-""}; do engine_gen "$M" "$mode" "resident_${Q}_graphs-${mode:-none}" --resident; done
  llama "resident_$Q" -m "$M" -ngl 99 -p 0 -n "$TOKENS" -r 3
done

# --- 4. streaming decode under memory.max ----------------------------------------------------------------
if [ "$STREAM" = 1 ]; then
  CG_ROOT=/sys/fs/cgroup; [ -f $CG_ROOT/cgroup.controllers ] || CG_ROOT=/sys/fs/cgroup/unified
  CG=$CG_ROOT/sparkd-cuda-bench
  echo "+memory" > "$CG_ROOT/cgroup.subtree_control" 2>/dev/null || true
  ENFORCED=0; grep -qw memory "$CG_ROOT/cgroup.subtree_control" 2>/dev/null && ENFORCED=1
  BUDGET_FLAG=()  # without a memory controller (a dry run elsewhere): the budget memory.max would give
  if [ $ENFORCED = 0 ]; then
    n=$(numfmt --from=iec "$STREAM_BUDGET"); h=$(( n / 20 )); [ $h -lt 268435456 ] && h=268435456
    BUDGET_FLAG=(--budget $(( n - h )))
    log "WARNING: no memory controller under $CG_ROOT: memory.max is NOT enforced; passing ${BUDGET_FLAG[*]}"
  fi
  cg_remove() { if [ -d "$CG" ]; then echo 1 > "$CG/cgroup.kill" 2>/dev/null || true; sleep 0.5; rmdir "$CG" 2>/dev/null || true; fi; }
  cg_new() {  # a fresh cgroup limited to $1, page cache dropped first
    cg_remove; sync; echo 3 > /proc/sys/vm/drop_caches
    mkdir "$CG"
    if [ $ENFORCED = 1 ]; then numfmt --from=iec "$1" > "$CG/memory.max"; echo 0 > "$CG/memory.swap.max" 2>/dev/null || true; fi
  }
  in_cg() { bash -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$CG" "$@"; }
  trap cg_remove EXIT
  sync; echo 3 > /proc/sys/vm/drop_caches
  $PY -m sparkd.cli.sparkctl disk-bench "$SM" --block-sizes "$DISK_BLOCKS" --queue-depths "$DISK_DEPTHS" \
    --seconds "$DISK_SECONDS" --json --no-save > "$OUT/disk.json" 2> "$OUT/disk.err" || log "disk-bench failed: $(tail -3 "$OUT/disk.err")"
  log "disk-bench: $(grep -o '"mb_per_second": [0-9.]*' "$OUT/disk.json" | sort -t: -k2 -n | tail -1)"
  RUN=(in_cg); TOKENS=$STREAM_TOKENS; TIMEOUT=$STREAM_TIMEOUT
  FEED_FLAG=(); [ -n "$STREAM_FEED" ] && FEED_FLAG=(--feed-tokens "$STREAM_FEED")
  for VB in $STREAM_VRAM_BUDGETS; do  # auto: the engine's default; 0: no VRAM cache (zero-copy)
    case $VB in auto) vflag=(--unified auto) ;; 0) vflag=(--unified on) ;; *) vflag=(--unified auto --vram-budget "$VB") ;; esac
    cg_new "$STREAM_BUDGET"
    # shellcheck disable=SC2086  # STREAM_ARGS is a list of flags
    engine_gen "$SM" "" "stream_Q8_0_vram-$VB" "${vflag[@]}" "${BUDGET_FLAG[@]}" "${FEED_FLAG[@]}" $STREAM_ARGS
    cat "$CG/memory.peak" > "$OUT/memory_peak_engine_stream_Q8_0_vram-$VB.txt" 2>/dev/null || true
  done
  if [ "$LLAMA" = 1 ]; then
    cg_new "$STREAM_BUDGET"; TIMEOUT=$LLAMA_STREAM_TIMEOUT
    llama stream_Q8_0 -m "$SM" -ngl 99 --n-cpu-moe 99 --no-host 1 -lm mmap -p 0 -n "$LLAMA_STREAM_TOKENS" -r 1
    cat "$CG/memory.peak" > "$OUT/memory_peak_llama_stream.txt" 2>/dev/null || true
  fi
  cg_remove; RUN=()
fi

# --- 5. summary -----------------------------------------------------------------------------------
$PY - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def engine(tag):
    try:
        return json.loads((out / f"engine_{tag}.json").read_text())["decode_tok_s"]
    except Exception:
        return None
def llama(tag):
    try:  # llama-bench's JSON array, whatever the CUDA backend printed before it
        text = (out / f"llama_{tag}.json").read_text()
        return json.JSONDecoder().raw_decode(text[text.index("["):])[0][0]["avg_ts"]
    except Exception:
        return None
print("| run | sparkd tok/s | llama.cpp tok/s | sparkd / llama.cpp |\n|---|---|---|---|")
for f in sorted(out.glob("engine_*.json")):
    tag = f.stem[len("engine_"):]
    kind, rest = tag.split("_", 1)  # resident_Q8_0_graphs-on, stream_Q8_0_vram-1G
    q = rest.split("_graphs")[0].split("_vram")[0]
    ref = llama(f"{kind}_{q}")
    ours = engine(tag)
    ratio = f"{ours / ref:.2f}" if ours and ref else "n/a"
    print(f"| {tag} | {ours if ours is None else round(ours, 2)} | {ref if ref is None else round(ref, 2)} | {ratio} |")
EOF
[ "$STREAM" = 1 ] && { $PY bench/gpu_box/streaming_summary.py --cuda "$OUT" | tee -a "$OUT/summary.md" || true; }
# at most 8 files come back from a device call: the raw logs travel as one archive
tar -czf "$WORK/raw.tgz" -C "$OUT" --exclude summary.md --exclude log.txt . && mv "$WORK/raw.tgz" "$OUT/" \
  && find "$OUT" -maxdepth 1 -type f ! -name raw.tgz ! -name summary.md ! -name log.txt -delete
log "done"
