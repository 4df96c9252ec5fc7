#!/usr/bin/env bash
# The VRAM expert cache on the GPU box, one device call (about 4 minutes):
#   1. GPU tests: streamed with the VRAM cache equals resident, zero-copy still does;
#   2. the qwen3-30b-a3b shape cut to 2 layers (1.85 GiB, Q8_0) at --budget 4G on CUDA, VRAM cache
#      (auto) and zero-copy (--unified on), with the plan's host and device sides;
#   3. a generated qwen3moe Q8_0 of MODEL_SIZE (3x BUDGET; written in the background during 1-2),
#      decode tok/s zero-copy only vs with the VRAM cache, --budget BUDGET, each run in its own
#      cgroup (no memory.max: the run must not die; memory.peak says whether the plan held).
# Run from the checkout root with PYTHONPATH set (wheels the box lacks installed first).
# Knobs: MODEL_SIZE=12G BUDGET=4G TOKENS=64 CTX=1024 READ_THREADS=32 OUT=/tmp/out WORK=/var/tmp/sparkd-vram
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WORK=${WORK:-/var/tmp/sparkd-vram}; mkdir -p "$WORK"
MODEL_SIZE=${MODEL_SIZE:-12G}; BUDGET=${BUDGET:-4G}; TOKENS=${TOKENS:-64}; CTX=${CTX:-1024}
READ_THREADS=${READ_THREADS:-32}
export PYTHONUNBUFFERED=1
T_START=$(date +%s)
log() { echo "[+$(( $(date +%s) - T_START ))s] $*" | tee -a "$OUT/log.txt"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  echo "host $(hostname) $(nproc) cores, $(awk '/MemTotal/{print $2/1048576 " GiB"}' /proc/meminfo), kernel $(uname -r)"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
BIG=$WORK/qwen3moe-$MODEL_SIZE.gguf SMALL=$WORK/q30-2l.gguf
python3 -m sparkd.engine.cli make-model "$BIG" --preset qwen3-30b-a3b --size "$MODEL_SIZE" --quant Q8_0 \
  --quiet --force > "$OUT/make_big.txt" 2>&1 & MAKE=$!

log "gpu tests"
timeout 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/engine/streaming/test_vram_cache.py \
  tests/engine/test_kernel_engine.py -k "vram or zero_copy" > "$OUT/tests.log" 2>&1
grep -E "passed|failed|error|vram cuda|zero-copy" "$OUT/tests.log" | tail -8 | tee -a "$OUT/log.txt"

log "2-layer model at --budget 4G"
timeout 60 python3 -m sparkd.engine.cli make-model "$SMALL" --preset qwen3-30b-a3b --layers 2 --quant Q8_0 --quiet --force
timeout 60 python3 -m sparkd.engine.cli plan "$SMALL" --device cuda --budget 4G --ctx "$CTX" > "$OUT/plan_2l.txt" 2>&1
for U in auto on; do
  timeout 90 python3 -m sparkd.engine.cli generate "$SMALL" --tokens 1,2,3,4,5,6,7,8 -n 32 --ctx "$CTX" \
    --device cuda --unified $U --budget 4G --json > "$OUT/gen_2l_$U.json" 2> "$OUT/gen_2l_$U.err"
  log "2-layer --unified $U: rc $? $(tail -c 300 "$OUT/gen_2l_$U.json")"
done

wait $MAKE; log "big model: $(cat "$OUT/make_big.txt")"
CG_ROOT=/sys/fs/cgroup; [ -f $CG_ROOT/cgroup.controllers ] || CG_ROOT=/sys/fs/cgroup/unified
echo "+memory" > "$CG_ROOT/cgroup.subtree_control" 2>/dev/null || true
timeout 60 python3 -m sparkd.engine.cli plan "$BIG" --device cuda --budget "$BUDGET" --ctx "$CTX" > "$OUT/plan_big.txt" 2>&1
for U in on auto; do
  CG=$CG_ROOT/sparkd-vram-$U; mkdir -p "$CG"
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  timeout 150 bash -c 'echo $$ > "$0/cgroup.procs" 2>/dev/null; exec "$@"' "$CG" \
    python3 -m sparkd.engine.cli generate "$BIG" --tokens 1,2,3,4 -n "$TOKENS" --ctx "$CTX" --device cuda \
    --unified $U --budget "$BUDGET" --read-threads "$READ_THREADS" --json > "$OUT/gen_big_$U.json" 2> "$OUT/gen_big_$U.err"
  log "big --unified $U: rc $? memory.peak $(cat "$CG/memory.peak" 2>/dev/null || echo n/a)"
  cat "$CG/memory.peak" > "$OUT/memory_peak_$U.txt" 2>/dev/null; rmdir "$CG" 2>/dev/null
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print("| run | decode tok/s | vram hit rate | host hit rate | MB read/token | MiB copied | read wait s | expert s | total s |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ("2l_on", "2l_auto", "big_on", "big_auto"):
    try:
        r = json.loads((out / f"gen_{name}.json").read_text().splitlines()[-1])
    except Exception as exc:
        print(f"| {name} | failed: {exc} |"); continue
    s, p = r.get("stream", {}), r.get("stream", {}).get("profile", {})
    print(f"| {name} | {r['decode_tok_s']:.2f} | {s.get('vram_hit_rate', 0):.3f} | {s.get('hit_rate', 0):.3f} | "
          f"{s.get('bytes_per_token', 0) / 1e6:.0f} | {s.get('vram_bytes_copied', 0) / 2**20:.0f} | "
          f"{p.get('read_wait_seconds', 0):.2f} | {p.get('expert_compute_seconds', 0):.2f} | {p.get('total_seconds', 0):.2f} |")
PY
log "total"
