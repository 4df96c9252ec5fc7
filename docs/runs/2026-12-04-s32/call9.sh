#!/usr/bin/env bash
# Session 32, call 9 (H200, carry [".whl"]): attend without repeating the keys and values per query head (MLA's one
# latent head was copied 64-128 times), on the GLM-5.2-shaped model's decode after 4000 tokens (its sparse
# attention runs attend), graphs and eager; the GPU tests that compare against attend. Results: $OUT/res.tgz.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
G=/var/tmp/glm5-5l-16e-Q4_K.gguf
( timeout 270 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/streaming/test_graph_step.py \
    tests/engine/test_cuda_graphs.py tests/engine/test_glm_dsa.py tests/engine/test_mla_prompt.py tests/engine/test_kv_f16.py \
    tests/engine/test_eager_decode.py > $R/tests1.txt 2>&1; echo "rc $?" >> $R/tests1.txt ) &
( timeout 270 python3 -m pytest -q -p no:cacheprovider tests/engine/test_fused_kernels.py > $R/tests2.txt 2>&1
  echo "rc $?" >> $R/tests2.txt ) &
python3 -m sparkd.engine.cli make-model $G --preset glm-5.2 --experts 16 --layers 5 --quant Q4_K --quiet
log "model made"
gen() {  # tag [flags...]
  local tag=$1; shift
  timeout 120 python3 -m sparkd.engine.cli generate $G --device cuda --json "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$tag.json) $(grep -o '"prompt_tok_s": [0-9.]*' $R/gen_$tag.json)"
}
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(4000)))")
gen res_graphs --resident --tokens 1,2,3,4,5,6,7,8 -n 128
gen long_graphs --resident --tokens $LT -n 64 --ctx 8192
gen long_eager --resident --tokens $LT -n 64 --ctx 8192 --cuda-graphs off
snap
wait
log "tests: $(tail -n 2 $R/tests1.txt | tr '\n' ' ') / $(tail -n 2 $R/tests2.txt | tr '\n' ' ')"
snap
