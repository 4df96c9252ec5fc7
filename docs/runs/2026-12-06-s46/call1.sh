#!/usr/bin/env bash
# For session 46's first device call (carry [".whl"]; ~5 minutes): the GPU tests session 45 could not run under
# SPARKD_SDPA_PRECISION=half, the default since da99795 (its budget ran out): the CUDA GQA memory case rewritten for
# half, the prompt cache's turns against whole prompts (their greedy tokens must be equal: half_emulation.py says they
# stay so on the CPU), the decode graphs and pipeline, the device argmax, the resident plan, the streaming steps; then
# SPARKD_MLA_PROMPT=mha-half (opt-in, session 45): its GPU test and mla_prefill_bench.py's mha against mha-half at
# DeepSeek V3's heads (if it pays: the 5-layer DeepSeek-V3-shaped model's 8000-token prompt next, against llama.cpp).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/log.txt
timeout 420 python3 -m pytest -q -s -p no:cacheprovider -m gpu -n 4 tests/engine/test_attention_memory.py \
  tests/engine/test_prompt_cache.py tests/engine/test_decode_graphs.py tests/engine/test_decode_pipeline.py \
  tests/engine/test_device_argmax.py tests/engine/test_resident_plan.py tests/engine/streaming \
  tests/engine/test_mla_prompt.py \
  > $OUT/t_half.txt 2>&1
echo "rc $? $(tail -n 1 $OUT/t_half.txt)" >> $OUT/log.txt
grep -E "^(FAILED|ERROR)|gap" $OUT/t_half.txt | head -40 >> $OUT/log.txt
(cd bench/gpu_box && timeout 120 python3 mla_prefill_bench.py --tokens 512,2048,8000 --new 512 --cached 7488 \
  --ways mha,mha-half,mha,mha-half --json $OUT/mla.json) > $OUT/mla.txt 2>&1
echo "mla bench rc $?" >> $OUT/log.txt; grep -v Warn $OUT/mla.txt | tail -8 >> $OUT/log.txt
