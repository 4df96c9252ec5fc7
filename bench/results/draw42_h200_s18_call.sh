#!/usr/bin/env bash
# Session 18, draw42 (H200, carry [".whl", ".xfer/draw42"], run from .xfer/draw42; draw41's head's sparkd/ in
# ./b): a temperature request's first token drawn on the device from the prompt's logits (StaticDecode.pick_from)
# instead of by the host Sampler.
#   1. the sampler's, graphs', pipeline's, device argmax's and prompt cache's GPU tests (5 groups in parallel)
#      while the 12-layer Qwen3-30B-A3B-shaped Q4_K model is made;
#   2. bench/first_draw_bench.py: one process, per setting (greedy, top_k 0, top_k 40, top_p 0.95) the decode of
#      128 tokens with the first token drawn on the host (before) and on the device (after), interleaved, 3 rounds,
#      and the first pick alone;
#   3. `generate -n 128` a process each, after (this tree) / before (draw41's head, ./b), as long as the time holds.
set -u; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R; W=/var/tmp/sparkd-cuda; mkdir -p $W; M=$W/q3-12-Q4_K.gguf
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[+$(el)s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
( [ -f $M ] || { nice -n 10 timeout 120 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b \
    --quant Q4_K --quiet --layers 12 && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!
E=tests/engine
G=("$E/test_device_sampler.py $E/test_device_sampler_fused.py"
   "$E/test_cuda_graphs.py -k '(prepared or generate or step_capture or eagerly) and not draw_the_same'"
   "$E/test_cuda_graphs.py -k 'not (prepared or generate or step_capture or eagerly)'"
   "$E/test_decode_pipeline.py $E/test_prompt_cache.py $E/test_device_argmax.py"
   "$E/test_cuda_graphs.py -k draw_the_same_tokens")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done; wait "${P[@]}"
for i in 1 2 3 4 5; do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt; snap
wait $MK; log "model $(ls -la $M 2>&1 | awk '{print $5}')"
timeout 45 python3 bench/first_draw_bench.py $M --json $R/first.json > $R/first.log 2>&1
log "first draw bench rc $?"; grep "^greedy\|^top_" $R/first.log | tee -a $OUT/log.txt; snap
# (as run; its "before" is void: `python3 -m` puts the cwd, this tree, before PYTHONPATH's ./b: cd into ./b instead)
gen() {  # tag way(before|after) round [flags]
  local p=$PWD; [ $2 = before ] && p=$PWD/b
  PYTHONPATH=/tmp/site:$p timeout 30 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 128 \
    --device cuda --resident --cuda-graphs on --json ${@:4} > $R/gen_$1_$2_$3.json 2> $R/gen_$1_$2_$3.err
  log "gen $1 $2 #$3 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$1_$2_$3.json)"
}
ok() { [ $(el) -lt ${LIMIT:-92} ]; }
ok && gen full after 1 --temp 0.8 --seed 1; ok && gen full before 1 --temp 0.8 --seed 1; snap
ok && gen greedy after 1; ok && gen full after 2 --temp 0.8 --seed 1; ok && gen full before 2 --temp 0.8 --seed 1
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
    print(tag, {w: [(r, s) for r, s, _ in v] for w, v in ways.items()},
          {w: len({str(t) for _, _, t in v}) == 1 for w, v in ways.items()}, "(each way's tokens repeat)")
PY
log done; snap
