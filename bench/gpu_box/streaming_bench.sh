#!/usr/bin/env bash
# Expert streaming on the GPU box, in one call (the box is bare at every start and has no internet):
#   1. sparkctl disk-bench on the NVMe (the bound);
#   2. a ~40 GB Qwen3-30B-A3B-shaped qwen3moe Q8_0 GGUF (generated);
#   3. sparkd-engine generate inside a cgroup v2 with memory.max = 10G (budget from memory.max),
#      memory.stat file bytes sampled while decoding (must stay flat), routing trace recorded;
#   4. llama.cpp CPU build (llama-bench, mmap) from the vendored llama-cpp-python 0.3.36 sdist in the
#      same cgroup limit, side by side; 5. simulate-cache on the recorded trace.
# Expects: the sdist tarball at .cache/llama_cpp_python-0.3.36.tar.gz (the repo's ignored .cache,
# carried with `run(carry=[".cache"])`), python3 with torch, numpy and gguf. Writes everything to $OUT.
# Usage (lead): bash bench/gpu_box/streaming_bench.sh   [MODEL_SIZE=40G BUDGET=10G TOKENS=16]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/streaming-out}; mkdir -p "$OUT"
WORK=${WORK:-/var/tmp/sparkd-stream}; mkdir -p "$WORK"   # a real disk, not tmpfs
MODEL_SIZE=${MODEL_SIZE:-40G}; BUDGET=${BUDGET:-10G}; TOKENS=${TOKENS:-16}
SDIST=${SDIST:-.cache/llama_cpp_python-0.3.36.tar.gz}
CG=/sys/fs/cgroup/sparkd-stream-bench
export PYTHONPATH=$PWD
PY=${PY:-python3}
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }
cleanup() { [ -d "$CG" ] && { echo 1 > "$CG/cgroup.kill" 2>/dev/null || true; sleep 1; rmdir "$CG" 2>/dev/null || true; }; }
trap cleanup EXIT

MODEL=$WORK/qwen3moe-$MODEL_SIZE.gguf
if [ ! -f "$MODEL" ]; then
  log "writing $MODEL"
  $PY -m sparkd.engine.cli make-model "$MODEL" --preset qwen3-30b-a3b --size "$MODEL_SIZE" --quant Q8_0 --quiet
fi
ls -l "$MODEL" | tee -a "$OUT/log.txt"

log "disk-bench"
$PY -m sparkd.cli.sparkctl disk-bench "$MODEL" --block-sizes 256K,1M,4M,16M --queue-depths 1,4,16,64 \
  --seconds 2 --json --no-save > "$OUT/disk.json"

log "cgroup $CG memory.max=$BUDGET"
cleanup; mkdir "$CG"
echo "+memory" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
$PY -c "import sys; from sparkd.engine.cli import parse_size; print(parse_size(sys.argv[1]))" "$BUDGET" > "$CG/memory.max"
echo 0 > "$CG/memory.swap.max"
sync; echo 3 > /proc/sys/vm/drop_caches || true

in_cg() { bash -c 'echo $$ > '"$CG"'/cgroup.procs; exec "$@"' bash "$@"; }
sample_file_bytes() { while sleep 1; do echo "$(date +%s) $(awk '$1=="file"{print $2}' $CG/memory.stat)"; done; }

log "sparkd-engine plan (budget from memory.max)"
in_cg $PY -m sparkd.engine.cli plan "$MODEL" --ctx 4096 --json > "$OUT/plan.json"
for PREFETCH in 0 8; do
  log "sparkd-engine generate prefetch=$PREFETCH"
  sample_file_bytes > "$OUT/memory_stat_file_prefetch$PREFETCH.txt" & SAMPLER=$!
  in_cg $PY -m sparkd.engine.cli generate "$MODEL" --tokens 1,2,3,4 -n "$TOKENS" --ctx 4096 --json \
    --prefetch $PREFETCH --trace "$OUT/trace_prefetch$PREFETCH.txt" \
    > "$OUT/generate_prefetch$PREFETCH.json" 2> "$OUT/generate_prefetch$PREFETCH.err" || log "generate failed: $(tail -3 $OUT/generate_prefetch$PREFETCH.err)"
  kill $SAMPLER; wait $SAMPLER 2>/dev/null || true
  cat "$CG/memory.peak" > "$OUT/memory_peak_prefetch$PREFETCH.txt" 2>/dev/null || true
done
for B in 2G 5G 10G; do
  $PY -m sparkd.engine.cli simulate-cache --trace "$OUT/trace_prefetch0.txt" --budget $B >> "$OUT/simulate.txt" || true
done

log "llama.cpp CPU build from $SDIST"
if [ -f "$SDIST" ]; then
  SRC=$WORK/llama-src; mkdir -p "$SRC"; tar -xzf "$SDIST" -C "$SRC" --strip-components=1
  LC=$SRC/vendor/llama.cpp; B=$WORK/llama-build
  FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cmake -S "$LC" -B "$B" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" \
    > "$OUT/llama_cmake.txt" 2>&1
  cmake --build "$B" -j"$(nproc)" --target llama-bench > "$OUT/llama_build.txt" 2>&1
  sync; echo 3 > /proc/sys/vm/drop_caches || true
  log "llama-bench mmap in the same cgroup"
  sample_file_bytes > "$OUT/memory_stat_file_llama.txt" & SAMPLER=$!
  timeout 900 bash -c "echo \$\$ > $CG/cgroup.procs; exec $B/bin/llama-bench -m $MODEL -p 0 -n $TOKENS -t 16 -mmp 1 -o json" \
    > "$OUT/llama_bench.json" 2> "$OUT/llama_bench.err" || log "llama-bench failed or timed out"
  kill $SAMPLER; wait $SAMPLER 2>/dev/null || true
else
  log "no $SDIST: skipping llama.cpp"
fi

$PY - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
disk = json.loads((out / "disk.json").read_text())
bound = disk["best"]["bytes_per_second"]
print(f"disk bound {bound / 1e9:.2f} GB/s ({disk['mode']})")
for f in sorted(out.glob("generate_prefetch*.json")):
    try:
        g = json.loads(f.read_text())
    except ValueError:
        continue
    s = g["stream"]
    print(f"{f.name}: {g['decode_tok_s']:.3f} tok/s, {s['bytes_per_token'] / 2**20:.1f} MiB/token, "
          f"read {s['bandwidth_bytes_per_second'] / 1e9:.2f} GB/s ({s['bandwidth_bytes_per_second'] / bound:.2f} of bound), "
          f"ratio to I/O bound {g['decode_tok_s'] * s['bytes_per_token'] / bound:.2f}, hit {s['hit_rate']:.3f}, "
          f"prefetch {s['prefetch_predicted']}/{s['prefetch_useful']}/{s['prefetch_wasted']}, profile {s['profile']}")
try:
    lb = json.loads((out / "llama_bench.json").read_text())
    print("llama.cpp mmap tok/s:", [r.get("avg_ts") for r in lb])
except (OSError, ValueError):
    print("llama.cpp: no result")
PY
