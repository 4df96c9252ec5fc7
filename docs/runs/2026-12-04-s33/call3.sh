#!/usr/bin/env bash
# Session 33, call 3 (H200, carry [".whl"]): Kimi-K3- and DeepSeek-V4-Flash-shaped resident decode through CUDA
# graphs (this tree) against the eager step (--cuda-graphs off: what both ran before this session's graphs); the
# GPU tests of the graph replays and the changed layers. Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
D=/var/tmp/deepseek-v4-flash-5l-16e-Q4_K.gguf
K=/var/tmp/kimi-k3-5l-32e-Q4_K.gguf
[ -f $D ] || python3 -m sparkd.engine.cli make-model $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --quiet &
[ -f $K ] || python3 -m sparkd.engine.cli make-model $K --preset kimi-k3 --experts 32 --layers 5 --quant Q4_K --quiet &
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_cuda_graphs.py tests/engine/test_hyper_conn.py \
    tests/engine/test_kernel_engine.py -k "own_decoders or graph_replay_equals or hyper or model_activations" \
    > $R/tests.txt 2>&1; echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
wait
gen() {  # tag model [flags...]
  local tag=$1 m=$2; shift 2
  timeout 150 python3 -m sparkd.engine.cli generate $m --device cuda --json "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$tag.json) $(grep -o '"prompt_tok_s": [0-9.]*' $R/gen_$tag.json) $(grep -m1 -o 'CUDA graphs.*' $R/gen_$tag.err)"
}
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
for r in 1 2; do
  gen dsv4_graphs_$r $D --resident --tokens 1,2,3,4,5,6,7,8 -n 128
  gen dsv4_eager_$r $D --resident --tokens 1,2,3,4,5,6,7,8 -n 128 --cuda-graphs off
  gen k3_graphs_$r $K --resident --tokens 1,2,3,4,5,6,7,8 -n 128
  gen k3_eager_$r $K --resident --tokens 1,2,3,4,5,6,7,8 -n 128 --cuda-graphs off
  snap
done
same() { python3 -c "import json,sys; a,b=(json.load(open(f))['tokens'] for f in sys.argv[1:]); print('greedy equal' if a==b else f'greedy differ at {next(i for i,(x,y) in enumerate(zip(a,b)) if x!=y)}')" $R/gen_$1.json $R/gen_$2.json; }
log "dsv4 graphs vs eager: $(same dsv4_graphs_1 dsv4_eager_1); k3: $(same k3_graphs_1 k3_eager_1)"
gen dsv4_long_graphs $D --resident --tokens $LT -n 64 --ctx 4096
gen k3_long_graphs $K --resident --tokens $LT -n 64 --ctx 4096
snap
