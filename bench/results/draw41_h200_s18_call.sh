#!/usr/bin/env bash
# Session 18, draw41 (H200, carry [".whl", ".xfer/draw41"], run from .xfer/draw41): where a temperature
# `generate -n 128` spends the ~160 us a token greedy does not, and the fix (generate captures its draw graphs
# and runs its host chain once before the timed region).
#   1. the sampler's, the CUDA graphs' and the pipelined decode's GPU tests (3 groups in parallel) while the
#      12-layer Qwen3-30B-A3B-shaped Q4_K model is made;
#   2. bench/draw_gap_bench.py: one process, the parts timed (host first draw, draw capture, decode first / again)
#      per setting, and torch.profiler over 32 warm tokens greedy / top_k 0 / top_k 40;
#   3. `generate -n 128` a process each, before (main's checkout at the box's root) / after (this branch),
#      interleaved, as long as the time holds: greedy, top_k 0, top_k 40, top_p 0.95; then a second round.
set -u; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W; M=$W/q3-12-Q4_K.gguf; ROOT=$(cd ../.. && pwd)
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[+$(el)s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
( [ -f $M ] || { nice -n 10 timeout 120 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b \
    --quant Q4_K --quiet --layers 12 && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!
E=tests/engine
G=("$E/test_device_sampler.py $E/test_device_sampler_fused.py $E/test_decode_pipeline.py"
   "$E/test_cuda_graphs.py -k 'prepared or generate or replay_equals or step_capture'"
   "$E/test_cuda_graphs.py -k 'not (prepared or generate or replay_equals or step_capture)'")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in 1 2 3; do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt; snap
wait $MK; log "model $(ls -la $M 2>&1 | awk '{print $5}')"
mkdir -p $R/trace
timeout 60 python3 bench/draw_gap_bench.py $M --json $R/gap.json --trace-dir $R/trace > $R/gap.log 2>&1
log "gap bench rc $?"; grep -v "^ " $R/gap.log | grep "^greedy\|^top_\|^profile" | tee -a $OUT/log.txt; snap
gen() {  # tag way(before|after) round [flags]
  local d=$PWD; [ $2 = before ] && d=$ROOT
  (cd $d && PYTHONPATH=/tmp/site timeout 30 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 128 \
    --device cuda --resident --cuda-graphs on --json ${@:4} > $R/gen_$1_$2_$3.json 2> $R/gen_$1_$2_$3.err)
  log "gen $1 $2 #$3 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$1_$2_$3.json)"
}
ok() { [ $(el) -lt ${LIMIT:-170} ]; }
S=(greedy "full --temp 0.8 --seed 1" "top40 --temp 0.8 --top-k 40 --seed 1" "topp95 --temp 0.8 --top-p 0.95 --seed 1")
ok && gen greedy after 1
for s in "${S[@]:1}"; do set -- $s; ok && gen $1 before 1 ${@:2}; ok && gen $1 after 1 ${@:2}; done; snap
for s in "${S[@]:1}"; do set -- $s; ok && gen $1 after 2 ${@:2}; ok && gen $1 before 2 ${@:2}; done
ok && gen greedy before 2
python3 - <<'PY' >> $OUT/log.txt
import glob, json
runs = {}
for f in sorted(glob.glob("/tmp/res/gen_*.json")):
    try:
        d = json.load(open(f))
    except Exception as e:
        print(f, "unreadable", type(e).__name__); continue
    tag, way, r = f.split("/")[-1][4:-5].rsplit("_", 2)
    runs.setdefault(tag, {}).setdefault(way, []).append((r, round(d["decode_tok_s"], 1), d["tokens"]))
for tag, ways in runs.items():
    toks = {str(t) for w in ways.values() for _, _, t in w}
    print(tag, {w: [(r, s) for r, s, _ in v] for w, v in ways.items()}, "same tokens" if len(toks) == 1 else f"{len(toks)} token lists")
PY
log done; snap
