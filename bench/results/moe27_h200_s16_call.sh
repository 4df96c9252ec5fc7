#!/usr/bin/env bash
# Session 16, moe27 (H200, carry [".whl", ".xfer/moe27"], run from .xfer/moe27): the MoE decode gate/up split over x's
# groups (GemvConfig.split on the gate/up, moe._fold_k; SPARKD_MOE_TILES=splitk: split 2 below width 4096).
# Ran on commit 80b6073, where "splitk" split the Q8_0 and the resident Q4_K gate/up below width 4096, and the resident
# Q4_K split read the wrong tiles (fixed after: its rows and its decode are void; the lead's final call re-measured them: docs/runs/2026-12-02-s16-final).
#   1. bench/moe_tiles_bench.py at 2048x768 / 4096x1536 / 7168x2048 top-8, Q8_0 and Q4_KXD (resident pairx): the
#      default layer ("all qx"), each launch alone, the default again (drift), and each split candidate's gate/up alone
#      and its layer with the default down, side by side in one process.
#   2. the MoE GPU tests (the new split test; the refactored default epilogue) in parallel groups.
#   3. the 12-layer Qwen3-30B-A3B-shaped decode (made in the background meanwhile), a process each, interleaved:
#      default vs SPARKD_MOE_TILES=splitk, Q8_0 and Q4_K (resident), two rounds as time allows.
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
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 105 python3 bench/moe_tiles_bench.py --sets new --no-twins \
  --types Q8_0,Q4_KXD --variants again --down "" --compile-workers 8 --json $R/moe.json \
  --gate-up "Q8_0@2/1/2/e/2,Q8_0@2/1/4/e/2,Q8_0@2/1/4/e,Q4_KXD@4/1/1/e/2,Q4_KXD@4/1/1/e/4" \
  > $R/moe.log 2>&1
log "moe bench rc $?"; snap
E=tests/engine
G=("$E/test_moe_tiles.py"
   "$E/test_moe_tiled.py"
   "$E/test_moe_decode_fusion.py $E/test_moe_down_full.py"
   "$E/test_moe_words_full.py $E/test_moe_reference.py $E/test_pdl.py")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 55 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR\|passed\|failed" $R/tests_*.log | head -20 | tee -a $OUT/log.txt; snap
wait; log "models: $(ls -la $W/*.gguf 2>&1 | awk '{print $5, $9}' | tr '\n' ' ')"
dec() {  # quant, way (default|splitk), round
  env $([ $2 = splitk ] && echo SPARKD_MOE_TILES=splitk) timeout 25 python3 -m sparkd.engine.cli generate \
    $W/q3-12-$1.gguf --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda --resident --cuda-graphs on --json \
    > $R/decode_$1_$2_$3.json 2> $R/decode_$1_$2_$3.err
  log "decode $1 $2 #$3 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/decode_$1_$2_$3.json)"
}
for r in 1 2; do for q in Q8_0 Q4_K; do for way in default splitk; do
  [ $(( $(date +%s) - T0 )) -lt 205 ] && dec $q $way $r; done; done; done
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
