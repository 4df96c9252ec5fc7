#!/usr/bin/env bash
# NOT YET RUN (written in session 22 without a GPU): the device call that times the grid i-quants' integer steps
# (branch iq50) and decides their defaults; docs/performance.md "Session 22: integer steps for IQ2_XXS and IQ3_XXS".
# Made from bench/results/iq48_h200_s21_call.sh (session 21's call for IQ4_XS / Q4_0); run it as that one ran:
# H200, carry [".whl", ".xfer/iq50"], from .xfer/iq50, ~5-6 min of device time with the start (one command, under
# the 600 s limit).
#   1. in parallel: the GPU tests of the steps (test_iq_grid_int, test_int_steps' rows of the four types: the PTX
#      against the interpreter's twins bit for bit, GEMV at 4099x4096 and odd rows, the MoE at 2048x768 top-8),
#      bench/int4_bench.py --warm a process per type (compiles every row's kernels into Triton's cache), a 2-layer
#      qwen3-30b-a3b-shaped IQ2_XXS model made in the background.
#   2. bench/int4_bench.py timed, one process: float (the default today) vs int side by side at the decode shapes.
#   3. as time allows: a resident decode of the 2-layer IQ2_XXS model, SPARKD_IQ2_XXS_INT=1 then the default.
# The rule: a type's switch turns on by default (INT_ENV's default True, test_switches' UNSET row, test_int_steps'
# OFF_BY_DEFAULT, docs/engine.md) where its tests pass and "int default" beats "float default" at both MoE shapes.
set -u; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
TYPES=IQ2_XXS,IQ3_XXS,IQ2_XS,IQ1_S
M=$W/q3-2-IQ2_XXS.gguf
(nice -n 10 timeout 60 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant IQ2_XXS \
  --quiet --layers 2 && mv $M.part $M) > $R/make.log 2>&1 &
MK=$!
E=tests/engine
G=("$E/test_iq_grid_int.py $E/test_kernel_engine.py -k 'iq_experts or negate or nibbles or grid_words or sums'"
   "$E/test_int_steps.py -k 'IQ2_XXS or IQ3_XXS or IQ2_XS or IQ1_S'")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 55 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/int4_bench.py --tiles 2/1/4/e,8/1/2/e"
for t in ${TYPES//,/ }; do (timeout 55 $B --warm --types $t > $R/warm_$t.log 2>&1; echo "rc $?" >> $R/warm_$t.log) &
  P+=($!); done
wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt
for t in ${TYPES//,/ }; do log "warm $t: $(tail -1 $R/warm_$t.log)"; done; snap
timeout 150 $B --types $TYPES --json $R/int.json > $R/int.log 2>&1
log "bench rc $?"; cat $R/int.log >> $OUT/log.txt; snap
wait $MK; log "model: $(ls -la $M 2>&1 | awk '{print $5}') $(tail -1 $R/make.log)"
dec() {  # way (int|float)
  env $([ $1 = int ] && echo SPARKD_IQ2_XXS_INT=1) timeout 25 python3 -m sparkd.engine.cli generate $M \
    --tokens 1,2,3,4,5,6,7,8 -n 64 --device cuda --resident --cuda-graphs on --json > $R/decode_$1.json 2> $R/decode_$1.err
  log "decode $1 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/decode_$1.json) $(tail -1 $R/decode_$1.err)"
}
for way in int float; do [ -f $M ] && [ $(( $(date +%s) - T0 )) -lt 240 ] && dec $way; done
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
