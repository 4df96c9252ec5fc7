#!/usr/bin/env bash
# Ran on commit 1c08497 (H200, 82.8 s of command on a cold box, ~182 s of device time with the start). Result:
# bench/results/iq48_h200_s21_{log.txt,int4.log,int4.json,tests.log,decode_*.json}; docs/performance.md "Session 21:
# the integer steps of IQ4_XS and Q4_0". The one failure (test_kernels MoE IQ4_XS/Q4_0) was the test data (see there).
# Session 21, iq48 (H200, carry [".whl", ".xfer/iq48"], run from .xfer/iq48): the integer steps of IQ4_XS
# (byte-permute table lookup + dp4a on Q8_K x) and Q4_0 (dp4a on Q8_0 x, the -8 by a dp4a of its own).
#   1. in parallel: the GPU tests of both steps (test_iq4_xs_int, test_q4_0_int, test_kernels' and
#      test_kernel_engine's IQ4_XS / Q4_0 rows), bench/int4_bench.py --warm a process per type (compiles every
#      row's kernels into Triton's cache), a 2-layer qwen3-30b-a3b-shaped IQ4_XS model made in the background.
#   2. bench/int4_bench.py timed, one process: float vs int side by side at the decode shapes.
#   3. as time allows: a resident decode of the 2-layer IQ4_XS model, int (default) then SPARKD_IQ4_XS_INT=0.
set -u; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
M=$W/q3-2-IQ4_XS.gguf
(nice -n 10 timeout 60 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant IQ4_XS \
  --quiet --layers 2 && mv $M.part $M) > $R/make.log 2>&1 &
MK=$!
E=tests/engine
G=("$E/test_iq4_xs_int.py $E/test_q4_0_int.py"
   "$E/test_kernels.py $E/test_moe_decode_fusion.py -k 'IQ4_XS or Q4_0'"
   "$E/test_kernel_engine.py -k 'IQ4_XS or Q4_0'")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 55 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/int4_bench.py --tiles 2/1/4/e,4/1/4/e"
for t in IQ4_XS Q4_0; do (timeout 55 $B --warm --types $t > $R/warm_$t.log 2>&1; echo "rc $?" >> $R/warm_$t.log) &
  P+=($!); done
wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt
log "warm: $(tail -1 $R/warm_IQ4_XS.log) / $(tail -1 $R/warm_Q4_0.log)"; snap
timeout 40 $B --json $R/int4.json > $R/int4.log 2>&1
log "bench rc $?"; cat $R/int4.log >> $OUT/log.txt; snap
wait $MK; log "model: $(ls -la $M 2>&1 | awk '{print $5}') $(tail -1 $R/make.log)"
dec() {  # way (int|float)
  env $([ $1 = float ] && echo SPARKD_IQ4_XS_INT=0) timeout 25 python3 -m sparkd.engine.cli generate $M \
    --tokens 1,2,3,4,5,6,7,8 -n 64 --device cuda --resident --cuda-graphs on --json > $R/decode_$1.json 2> $R/decode_$1.err
  log "decode $1 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/decode_$1.json) $(tail -1 $R/decode_$1.err)"
}
for way in int float; do [ -f $M ] && [ $(( $(date +%s) - T0 )) -lt 80 ] && dec $way; done
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
