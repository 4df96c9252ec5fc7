#!/usr/bin/env bash
# Session 32, call 8 (H200, carry [".whl"]): glm-dsa (GLM-5.2-shaped) decode through CUDA graphs and streamed
# segments (c0062d1: the lightning indexer selects by device position) against the eager step it ran before; the
# GPU tests of the changed paths. Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
G=/var/tmp/glm5-5l-16e-Q4_K.gguf
( timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/streaming/test_graph_step.py \
    tests/engine/test_cuda_graphs.py tests/engine/test_glm_dsa.py tests/engine/test_mla_prompt.py > $R/tests.txt 2>&1
  echo "rc $?" >> $R/tests.txt ) &
python3 -m sparkd.engine.cli make-model $G --preset glm-5.2 --experts 16 --layers 5 --quant Q4_K --quiet
log "model made"
gen() {  # tag [flags...]
  local tag=$1; shift
  timeout 120 python3 -m sparkd.engine.cli generate $G --device cuda --json "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$tag.json) $(grep -o '"prompt_tok_s": [0-9.]*' $R/gen_$tag.json) $(grep -m1 -o 'CUDA graphs.*\|streamed decode.*' $R/gen_$tag.err)"
}
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(4000)))")
for r in 1 2; do
  gen res_graphs_$r --resident --tokens 1,2,3,4,5,6,7,8 -n 128
  gen res_eager_$r --resident --tokens 1,2,3,4,5,6,7,8 -n 128 --cuda-graphs off
  snap
done
gen long_graphs --resident --tokens $LT -n 64 --ctx 8192
gen long_eager --resident --tokens $LT -n 64 --ctx 8192 --cuda-graphs off
for u in auto on; do
  gen stream_${u}_exp --budget 4G --unified $u --tokens 1,2,3,4,5,6,7,8 -n 64
  SPARKD_STREAM_GRAPHS=off gen stream_${u}_off --budget 4G --unified $u --tokens 1,2,3,4,5,6,7,8 -n 64
done
snap
wait
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
snap
