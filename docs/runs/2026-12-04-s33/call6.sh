#!/usr/bin/env bash
# Session 33, call 6 (H200, carry [".whl", ".cache"]): the DeepSeek-V4-Flash-shaped graph step after a 6000-token
# prompt (the 8192 bucket), its attention over the window's rows (this tree) against the span's (.cache/old: 6ae405c); the GPU
# replay tests. Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
NEW=/tmp/site:$PWD
OLD=/tmp/site:$PWD/.cache/old
export PYTHONPATH=$NEW
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
D=/var/tmp/deepseek-v4-flash-5l-16e-Q4_K.gguf
[ -f $D ] || python3 -m sparkd.engine.cli make-model $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --quiet &
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_cuda_graphs.py -k "graph_replay_equals" \
    > $R/tests.txt 2>&1; echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
wait
gen() {  # tag pythonpath [flags...]
  local tag=$1 pp=$2; shift 2
  PYTHONPATH=$pp timeout 60 python3 -m sparkd.engine.cli generate $D --device cuda --json "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$tag.json) $(grep -o '"prompt_tok_s": [0-9.]*' $R/gen_$tag.json)"
}
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(6000)))")
gen long_new $NEW --resident --tokens $LT -n 128 --ctx 8192
gen long_old $OLD --resident --tokens $LT -n 128 --ctx 8192
snap
