#!/usr/bin/env bash
# Ran on commit 1e8e681 (the candidate default: Q8_0 gate/up 2/1/4/e below 4096, 2/1/4/e capped at 64 registers from
# 4096, GemvConfig.maxnreg, SPARKD_MOE_TILES=s16 back; all taken out again after the call: below the 3 % bar).
# Session 17, moe39 (H200, carry [".whl", ".xfer/moe39"], run from .xfer/moe39): the MoE decode layer's floor below
# width 7168, then one try at the gate/up's warps in flight.
#   1. bench/moe_tiles_bench.py --floor at 2048x768 / 4096x1536 / 7168x2048 top-8, Q8_0 and Q4_KXD (resident pairx):
#      the layer's bytes as one copy, as the gate/up's then the down's copy (torch; Triton with and without PDL), the
#      load-only twins, beside the "all qx" layer of the candidate default ("default") and of "s16" (the tiles before).
#   2. the candidate's tiles alone (Q8_0 gate/up 2/1/4/e below 4096, capped at 64 registers from 4096) and two more.
#   3. the MoE GPU tests (the new bits test at 2048 and 4096) in parallel groups.
#   4. the 12-layer Qwen3-30B-A3B-shaped decode (made in the background meanwhile), a process each, interleaved:
#      default vs SPARKD_MOE_TILES=s16, Q8_0 two rounds, then Q4_K (unchanged tiles: the drift) as time allows.
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
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 115 python3 bench/moe_tiles_bench.py --floor --defaults-only --sets s16 \
  --types Q8_0,Q4_KXD --variants again --compile-workers 8 --json $R/moe.json > $R/moe.log 2>&1
log "floor bench rc $?"; snap
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 50 python3 bench/moe_tiles_bench.py --sets s16 --no-twins --types Q8_0 \
  --gate-up 2/1/4/e+r64,1/1/8/e,2/1/2/e --down "" --compile-workers 8 --json $R/tiles.json > $R/tiles.log 2>&1
log "tiles bench rc $?"; snap
E=tests/engine
G=("$E/test_moe_tiles.py $E/test_moe_tiled.py"
   "$E/test_kernels.py -k moe"
   "$E/test_moe_decode_fusion.py $E/test_moe_down_full.py"
   "$E/test_moe_words_full.py $E/test_moe_reference.py $E/test_pdl.py")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt; snap
wait; log "models: $(ls -la $W/*.gguf 2>&1 | awk '{print $5, $9}' | tr '\n' ' ')"
dec() {  # quant, way (default|s16), round
  env $([ $2 = s16 ] && echo SPARKD_MOE_TILES=s16) timeout 25 python3 -m sparkd.engine.cli generate \
    $W/q3-12-$1.gguf --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda --resident --cuda-graphs on --json \
    > $R/decode_$1_$2_$3.json 2> $R/decode_$1_$2_$3.err
  log "decode $1 $2 #$3 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/decode_$1_$2_$3.json)"
}
for r in 1 2; do for way in default s16; do [ $(( $(date +%s) - T0 )) -lt 255 ] && dec Q8_0 $way $r; done; done; snap
for way in default s16; do [ $(( $(date +%s) - T0 )) -lt 255 ] && dec Q4_K $way 1; done
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
