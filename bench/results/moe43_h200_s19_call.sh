#!/usr/bin/env bash
# Session 19, moe43 (H200, carry [".whl", ".xfer/B"], run from .xfer/B): the pairx gate/up with each group's loads
# issued 1 or 2 groups before its dots (q4_k_pair.gate_up, Kernels.pairx_ahead), the pairx down with the next
# group's loads issued early (q4_k_pair.down, Kernels.pairx_down_ahead), and the pairx step handed its tile.
#   1. the MoE GPU tests touched (the new bits tests at 2048 and 4096, the re-gridded pairx GEMV) while the 12-layer
#      Qwen3-30B-A3B-shaped Q4_K model is made in the background.
#   2. bench/moe_tiles_bench.py at 2048x768 / 4096x1536 top-8, Q4_KX and Q4_KXD, with SPARKD_MOE_PAIRX_AHEAD=0 (the
#      default rows: the idot loop, the code before), --floor, `again`, twins; candidates (gate/up alone and the
#      "all qx" layer): :wpvVfd (the default's kernels spelled out, ahead 0: the control), :wpvVfda (ahead 1),
#      :wpvVfdA (ahead 2); Q4_KXD's down at its tiles (4/1/3/e/4 below 4096, 4/1/2/e/4 from there) :wpvVfd (control)
#      and :wpvVfdb (ahead 1). Then the default rows again with SPARKD_MOE_PAIRX_AHEAD=1 and =2 (both launches ahead).
#   3. the 12-layer decode (`generate -n 128 --cuda-graphs on`), a process each, interleaved: SPARKD_MOE_PAIRX_AHEAD
#      0 / 1 / 2, two rounds as time allows.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
mk() { [ -f $1 ] || { nice -n 10 timeout 150 python3 -m sparkd.engine.cli make-model $1.part --preset qwen3-30b-a3b \
  --quant $2 --quiet --layers 12 && mv $1.part $1; }; }
(mk $W/q3-12-Q4_K.gguf Q4_K) > $R/make.log 2>&1 &
MK=$!
E=tests/engine
G=("$E/test_moe_pairx_ahead.py $E/test_moe_tiled.py"
   "$E/test_q4_k_tiled.py -k pairx")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 70 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt; snap
SPARKD_MOE_PAIRX_AHEAD=0 PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 90 python3 bench/moe_tiles_bench.py --floor \
  --sets new --types Q4_KX,Q4_KXD --shapes 2048x768x8,4096x1536x8 --variants again \
  --gate-up 4/1/1/e:wpvVfd,4/1/1/e:wpvVfda,4/1/1/e:wpvVfdA --compile-workers 8 --json $R/moe.json \
  --down Q4_KXD@4/1/3/e/4:wpvVfd,Q4_KXD@4/1/3/e/4:wpvVfdb,Q4_KXD@4/1/2/e/4:wpvVfd,Q4_KXD@4/1/2/e/4:wpvVfdb \
  > $R/moe.log 2>&1
log "bench rc $?"; snap
for a in 1 2; do
  SPARKD_MOE_PAIRX_AHEAD=$a PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 30 python3 bench/moe_tiles_bench.py \
    --defaults-only --no-twins --sets new --types Q4_KX,Q4_KXD --shapes 2048x768x8,4096x1536x8 --variants again \
    --compile-workers 8 --json $R/moe_a$a.json > $R/moe_a$a.log 2>&1
  log "bench ahead $a rc $?"; snap
done
wait $MK; log "model: $(ls -la $W/*.gguf 2>&1 | awk '{print $5, $9}' | tr '\n' ' ')"
dec() {  # ahead (0|1|2), round
  SPARKD_MOE_PAIRX_AHEAD=$1 timeout 25 python3 -m sparkd.engine.cli generate \
    $W/q3-12-Q4_K.gguf --tokens 1,2,3,4,5,6,7,8 -n 128 --device cuda --resident --cuda-graphs on --json \
    > $R/decode_a$1_$2.json 2> $R/decode_a$1_$2.err
  log "decode ahead $1 #$2 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/decode_a$1_$2.json)"
}
for r in 1 2; do for a in 0 1 2; do [ $(( $(date +%s) - T0 )) -lt ${END_S:-215} ] && dec $a $r; done; snap; done
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
