#!/usr/bin/env bash
# Session 11 prefill24's second device call (H200, cold box; carry [".whl", ".xfer/prefill24"], run from
# .xfer/prefill24): call 1 found a padded prompt's logits not always the eager prompt's bits (the GPU test
# asserted them equal: tiny Q4_K, 5 tokens). The revised GPU test (replay == padded forward; == eager where
# the prompt fills its bucket), and bench/gpu_box/prompt_pad_diff.py: the first op whose bits the padding moves.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res2; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
log start
timeout 50 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_cuda_graphs.py -k prompt_graph > $R/gpu_tests.log 2>&1 & P=$!
for q in Q4_K Q8_0; do
  (cd bench/gpu_box && timeout 33 python3 prompt_pad_diff.py --quant $q --tokens 5,70,200,600 --json $R/pad_diff_$q.json) > $R/pad_diff_$q.log 2>&1
  log "pad diff $q rc $?: $(grep tokens $R/pad_diff_$q.log | tr '\n' ';')"
done
wait $P; log "tests rc $?: $(tail -1 $R/gpu_tests.log)"
cp $R/log.txt $OUT/; cd /tmp && tar czf $OUT/res2.tgz res2
