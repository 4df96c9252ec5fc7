#!/usr/bin/env bash
# kda41 (session 18): the chunked KDA prompt rule's peak bytes on the H200 against the memory plan's count
# (kda.chunks_peak_bytes), its time and peak before (main's kda.py, carried as kda_main.py) and after the
# in-place rewrite, side by side in one process; then the GPU tests of the rule and the model.
set -u; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=$OUT/kda41_h200_s18; mkdir -p $R
save() { tar czf $OUT/res.tgz -C $OUT kda41_h200_s18; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt 2>&1
timeout 60 python3 bench/kda_prompt_bench.py --device cuda --tokens 256,512,2048 --chunks 32,64 --reps 3 \
  --before kda_main.py --json $R/rule.json > $R/rule.log 2>&1; echo "rc $?" >> $R/rule.log; save
timeout 70 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE -s tests/engine/test_kda_memory.py \
  tests/engine/test_kimi_k3.py --durations=4 > $R/gpu_tests.log 2>&1; echo "rc $?" >> $R/gpu_tests.log; save
cat $R/rule.log; grep -E "peak|passed|failed|rc " $R/gpu_tests.log | tail -20
