#!/usr/bin/env bash
# Session 32, call 1 (H200, carry [".whl"]): where MLA's eager and streamed decode steps go.
# - the GPU tests session 31 left unrun (kimi-k3's, the grouped kernel at FOLD_VALUES 16384, the segment graphs);
# - decode_profile.py on the 5-layer DeepSeek-V3-shaped Q4_K model (resident: eager per-stage profile, graph replay);
# - the streamed decode of the same file (--budget 4G: experts read on the host, every step eager today:
#   segment_blocker refuses MLA and shared experts), its stage profile in the JSON, zero-copy and VRAM cache.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
R=$OUT; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
M=/var/tmp/deepseek-v3-5l-16e-Q4_K.gguf
( timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_kimi_k3.py tests/engine/test_kimi_k3_think.py \
    tests/engine/streaming/test_graph_step.py tests/engine/test_eager_decode.py > $R/tests1.txt 2>&1; echo "rc $?" >> $R/tests1.txt ) &
( timeout 240 python3 -m pytest -q -p no:cacheprovider tests/engine/test_fused_kernels.py -k 'grouped or mla or decode_attention' \
    > $R/tests2.txt 2>&1; echo "rc $?" >> $R/tests2.txt ) &
timeout 200 python3 bench/gpu_box/decode_profile.py --preset deepseek-v3 --experts 16 --layers 5 --quant Q4_K \
  --dir /var/tmp --json $R/mla_profile.json > $R/mla_profile.txt 2>&1; log "profile rc $?"
ls -la /var/tmp/*.gguf | tee -a $R/log.txt
M=$(ls /var/tmp/deepseek-v3-5l*.gguf | head -1)
python3 -m sparkd.engine.cli plan $M --budget 4G --ctx 1024 --device cuda > $R/plan.txt 2>&1; log "plan rc $?"
for u in on auto; do
  timeout 150 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 64 --device cuda --budget 4G \
    --unified $u --json > $R/stream_$u.json 2> $R/stream_$u.err; log "stream $u rc $? $(grep -o '"decode_tok_s": [0-9.]*' $R/stream_$u.json)"
done
wait
log "tests: $(tail -2 $R/tests1.txt | tr '\n' ' ') / $(tail -2 $R/tests2.txt | tr '\n' ' ')"
