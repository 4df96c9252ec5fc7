#!/usr/bin/env bash
# Session 33, call 1 (H200, carry [".whl", ".cache"]): DeepSeek V4's and Kimi K3's routed experts through the MoE
# kernels (their activations fused: swiglu_clamp, situ) against the torch path they took before (the tree before
# the change, .cache/old, made by `git archive b39abe7 sparkd | tar -x -C .cache/old`); the GPU tests of the change.
# Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
NEW=/tmp/site:$PWD
OLD=/tmp/site:$PWD/.cache/old
export PYTHONPATH=$NEW
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
D=/var/tmp/dsv4-5l-16e-Q4_K.gguf
K=/var/tmp/k3-5l-32e-Q4_K.gguf
python3 -m sparkd.engine.cli make-model $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --quiet &
python3 -m sparkd.engine.cli make-model $K --preset kimi-k3 --experts 32 --layers 5 --quant Q4_K --quiet &
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_kernels.py tests/engine/test_kernel_engine.py \
    -k "fuse_the_models or model_activations" > $R/tests.txt 2>&1; echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
wait
log "models made: $(ls -la /var/tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
snap
gen() {  # tag pythonpath model [flags...]
  local tag=$1 pp=$2 m=$3; shift 3
  PYTHONPATH=$pp timeout 150 python3 -m sparkd.engine.cli generate $m --device cuda --json "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$tag.json) $(grep -o '"prompt_tok_s": [0-9.]*' $R/gen_$tag.json)"
}
for r in 1 2; do
  gen dsv4_new_$r $NEW $D --resident --tokens 1,2,3,4,5,6,7,8 -n 64
  gen dsv4_old_$r $OLD $D --resident --tokens 1,2,3,4,5,6,7,8 -n 64
  gen k3_new_$r $NEW $K --resident --tokens 1,2,3,4,5,6,7,8 -n 64
  gen k3_old_$r $OLD $K --resident --tokens 1,2,3,4,5,6,7,8 -n 64
  snap
done
gen dsv4_stream_new $NEW $D --budget 4G --tokens 1,2,3,4,5,6,7,8 -n 32
gen dsv4_stream_old $OLD $D --budget 4G --tokens 1,2,3,4,5,6,7,8 -n 32
snap
