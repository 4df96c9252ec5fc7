#!/usr/bin/env bash
# Ran on commit 3b7ced6 (the L2 prefetch, taken out again in c01b848: --variants nopf,pf,pfl and
# SPARKD_MOE_PREFETCH_DOWN exist only there).
# Session 15, moe26 (H200, carry [".whl", ".xfer/moe26"], run from .xfer/moe26): the MoE gate/up asking the L2 for
# its expert's down bytes (moe_tiles.Kernels.prefetch_down; $SPARKD_MOE_PREFETCH_DOWN, default auto: before the
# gate/up's loop below model width 4096).
#   1. bench/moe_tiles_bench.py at 2048x768 / 4096x1536 / 7168x2048 top-8, Q8_0 and Q4_KXD (resident pairx), default
#      tiles ("default": the auto rule) with --variants nopf,pf,pfl,again (nowhere / before / after the loop / the
#      default again); Q8_0 also two one-wave tiles with fewer steps (gate/up 2/1/4/e, down 4/1/3/g/8).
#   2. the MoE GPU tests (the default: the prefetch on at the tests' 2048-wide shapes) in parallel groups.
#   3. the 12-layer Qwen3-30B-A3B-shaped decode (made in the background meanwhile), a process each, interleaved:
#      default vs SPARKD_MOE_PREFETCH_DOWN=off, Q8_0 two rounds, Q4_K (resident) one or two as time allows.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
mk() { [ -f $1 ] || { nice -n 10 timeout 150 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b \
  --quant $2 --quiet --layers 12 && mv $1.part $1; }; }
(mk $W/q3-12-Q8_0.gguf Q8_0; mk $W/q3-12-Q4_K.gguf Q4_K) > $R/make.log 2>&1 &
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 75 python3 bench/moe_tiles_bench.py --defaults-only --sets new --no-twins \
  --types Q8_0,Q4_KXD --variants nopf,pf,pfl,again --compile-workers 8 --json $R/moe.json > $R/moe.log 2>&1
log "moe bench rc $?"; snap
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 35 python3 bench/moe_tiles_bench.py --sets new --no-twins --types Q8_0 \
  --gate-up 2/1/4/e --down 4/1/3/g/8 --compile-workers 8 --json $R/moe_tiles.json > $R/moe_tiles.log 2>&1
log "moe tiles rc $?"; snap
E=tests/engine
G=("$E/test_moe_tiles.py"
   "$E/test_moe_tiled.py"
   "$E/test_moe_decode_fusion.py $E/test_moe_down_full.py"
   "$E/test_moe_words_full.py $E/test_moe_reference.py $E/test_moe_twin.py"
   "$E/test_kernels.py -k moe"
   "$E/test_pdl.py")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 85 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt; snap
wait; log "models: $(ls -la $W/*.gguf 2>&1 | awk '{print $5, $9}' | tr '\n' ' ')"
dec() {  # quant, way (default|off), round
  env $([ $2 = off ] && echo SPARKD_MOE_PREFETCH_DOWN=off) timeout 25 python3 -m sparkd.engine.cli generate \
    $W/q3-12-$1.gguf --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda --resident --cuda-graphs on --json \
    > $R/decode_$1_$2_$3.json 2> $R/decode_$1_$2_$3.err
  log "decode $1 $2 #$3 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/decode_$1_$2_$3.json)"
}
for r in 1 2; do for way in default off; do [ $(( $(date +%s) - T0 )) -lt 205 ] && dec Q8_0 $way $r; done; done; snap
for r in 1 2; do for way in default off; do [ $(( $(date +%s) - T0 )) -lt 205 ] && dec Q4_K $way $r; done; done
python3 - <<'PY' >> $OUT/log.txt
import glob, hashlib, json
for f in sorted(glob.glob("/tmp/res/decode_*.json")):  # the tokens' digest: the same bits give the same tokens
    try:
        d = json.load(open(f))
        print(f.split("/")[-1], round(d["decode_tok_s"], 1), hashlib.sha1(str(d["tokens"]).encode()).hexdigest()[:12])
    except Exception as e:
        print(f, "unreadable", type(e).__name__)
PY
log done; snap
