#!/usr/bin/env bash
# Session 15, pipe27 (NOT run by pipe27: no device budget; for the lead's call, H200, carry [".whl", ".xfer/pipe27"],
# run from .xfer/pipe27): the pipelined decode (StaticDecode.launch, $SPARKD_DECODE_PIPELINE auto vs off).
#   1. the GPU tests of the pipeline and of the graph step / device sampler it drives.
#   2. the 12-layer Qwen3-30B-A3B-shaped decode, Q8_0 and Q4_K, a process each, interleaved auto/off, two rounds;
#      greedy (device argmax) and a seeded temperature draw (the device sampler); the tokens must be equal.
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
MK=$!
E=tests/engine
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $E/test_decode_pipeline.py $E/test_device_sampler.py \
  "$E/test_cuda_graphs.py::test_engine_generate_equal_with_and_without_graphs" \
  "$E/test_cuda_graphs.py::test_generate_cli_tokens_equal_with_and_without_graphs" > $R/tests.log 2>&1
log "tests rc $?: $(tail -1 $R/tests.log)"; snap
wait $MK
for q in Q8_0 Q4_K; do for r in 1 2; do for mode in auto off; do for how in greedy temp; do
  extra=""; [ $how = temp ] && extra="--temp 0.8 --seed 1"
  SPARKD_DECODE_PIPELINE=$mode timeout 60 python3 -m sparkd.engine.cli generate $W/q3-12-$q.gguf --tokens 1,2,3,4,5,6,7,8 \
    -n 128 --device cuda --resident --cuda-graphs on --json $extra > $R/decode_${q}_${how}_${mode}_$r.json 2> $R/decode_${q}_${how}_${mode}_$r.err
  log "decode $q $how $mode #$r rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/decode_${q}_${how}_${mode}_$r.json)"
done; done; done; done
for q in Q8_0 Q4_K; do for how in greedy temp; do
  python3 -c "import json,sys; t=[json.load(open(f))['tokens'] for f in sys.argv[1:]]; print('$q $how tokens equal:', all(x == t[0] for x in t))" \
    $R/decode_${q}_${how}_*_*.json 2>&1 | tee -a $OUT/log.txt
done; done
snap
