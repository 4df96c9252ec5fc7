#!/usr/bin/env bash
# Session 34, call 1 (H200, carry [".whl"]): the streamed decode of Kimi K3 and DeepSeek V4 through graph segments
# (their blocks' streams handed between segments) against the eager step (SPARKD_STREAM_GRAPHS=off, what both ran
# before), every expert cached (host overhead alone) and Kimi K3 under a budget that reads experts per token; the GPU
# tests of the streamed steps, the whole-token graphs' capture (KVCache.state_kept) and generate's decode_step.
# Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
D=/var/tmp/deepseek-v4-flash-5l-16e-Q4_K.gguf
K=/var/tmp/kimi-k3-5l-32e-Q4_K.gguf
( timeout 280 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/streaming/test_graph_step.py \
    tests/engine/test_cuda_graphs.py -k "segment or replay_equals_eager or generate_cli" > $R/tests.txt 2>&1; echo "rc $?" >> $R/tests.txt ) & TP=$!
[ -f $D ] || python3 -m sparkd.engine.cli make-model $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --quiet
[ -f $K ] || python3 -m sparkd.engine.cli make-model $K --preset kimi-k3 --experts 32 --layers 5 --quant Q4_K --quiet
log "models made"
wait $TP
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
snap
gen() {  # tag model budget [env...]
  local tag=$1 m=$2 b=$3; shift 3
  env "$@" timeout 150 python3 -m sparkd.engine.cli generate $m --tokens 1,2,3,4,5,6,7,8 -n 64 --device cuda \
    --budget $b --json > $R/gen_$tag.json 2> $R/gen_$tag.err
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ') $(grep -o 'streamed decode.*' $R/gen_$tag.err | head -1)"
}
for r in 1 2; do
  gen k3_off_$r $K 8G SPARKD_STREAM_GRAPHS=off
  gen k3_exp_$r $K 8G SPARKD_STREAM_GRAPHS=experts
  gen dsv4_off_$r $D 4G SPARKD_STREAM_GRAPHS=off
  gen dsv4_exp_$r $D 4G SPARKD_STREAM_GRAPHS=experts
  snap
done
gen k3_seg $K 8G SPARKD_STREAM_GRAPHS=segments
gen k3_tight_off $K 3G SPARKD_STREAM_GRAPHS=off
gen k3_tight_exp $K 3G SPARKD_STREAM_GRAPHS=experts
snap
