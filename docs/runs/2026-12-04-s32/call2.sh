#!/usr/bin/env bash
# Session 32, call 2 (H200, carry [".whl"]): streamed decode with segment graphs over dense layers, shared experts
# and MLA (484d1ee) against the eager step, on the 5-layer DeepSeek-V3-shaped Q4_K model and an 8-layer
# Qwen3-30B-A3B-shaped one; the GPU tests of the streamed steps. Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
V3=/var/tmp/dsv3-5l-16e-Q4_K.gguf; Q3=/var/tmp/q3-8l-Q4_K.gguf
( timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/streaming/test_graph_step.py \
    tests/engine/streaming/test_eager_step.py tests/engine/test_eager_decode.py > $R/tests1.txt 2>&1; echo "rc $?" >> $R/tests1.txt ) &
python3 -m sparkd.engine.cli make-model $V3 --preset deepseek-v3 --experts 16 --layers 5 --quant Q4_K --quiet
python3 -m sparkd.engine.cli make-model $Q3 --preset qwen3-30b-a3b --layers 8 --quant Q4_K --quiet
log "models made"
gen() {  # tag model budget unified [env...]
  local tag=$1 m=$2 b=$3 u=$4; shift 4
  env "$@" timeout 120 python3 -m sparkd.engine.cli generate $m --tokens 1,2,3,4,5,6,7,8 -n 64 --device cuda \
    --budget $b --unified $u --json > $R/gen_$tag.json 2> $R/gen_$tag.err
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$tag.json) $(grep -o 'streamed decode.*' $R/gen_$tag.err | head -1)"
}
for round in 1 2; do
  for u in auto on; do
    gen v3_${u}_off_$round $V3 4G $u SPARKD_STREAM_GRAPHS=off
    gen v3_${u}_seg_$round $V3 4G $u SPARKD_STREAM_GRAPHS=segments
    gen v3_${u}_exp_$round $V3 4G $u SPARKD_STREAM_GRAPHS=experts
  done
  snap
done
gen v3_tight_off $V3 1200M on SPARKD_STREAM_GRAPHS=off
gen v3_tight_exp $V3 1200M on SPARKD_STREAM_GRAPHS=experts
for u in auto on; do
  gen q3_${u}_off $Q3 4G $u SPARKD_STREAM_GRAPHS=off
  gen q3_${u}_exp $Q3 4G $u SPARKD_STREAM_GRAPHS=experts
done
wait
log "tests: $(tail -2 $R/tests1.txt | tr '\n' ' ')"
snap
