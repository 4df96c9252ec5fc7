#!/usr/bin/env bash
# Session 42, call 2 (carry [".whl", ".cache"], .cache/old = a28a47d's sparkd): the MXFP4 experts' grouped integer GEMM
# (gpt-oss's prompt: 154 of 357 ms at 8000 tokens, session 41) at other launches, bench/igemm_bench.py at gpt-oss-20b's
# shape (32 experts of 2880x2880, top 4), expert tiles of 32 and 64 rows; then gpt-oss's prompt graphs to 2048 (new)
# against 1024 (old): load, first token, each bucket's memory alone (bench/gpu_box/prompt_graphs_load.py).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW:$NEW/bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
python3 -m sparkd.engine.cli make-model $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4 \
  --quiet > $R/make.log 2>&1 &
MK=$!
IG="python3 bench/igemm_bench.py --types MXFP4T --grouped-types MXFP4T --shapes '' --grouped 2880x2880 --experts 32 --top-k 4 --tokens 2000,8000"
eval timeout 150 $IG --block-t 32 --ways s13,64/32/4/1/2/0,128/32/4/1/2/0,128/32/8/1/2/0,64/32/8/1/2/0 \
  --json $R/ig32.json > $R/ig32.txt 2>&1; log "ig32 rc $?"
snap
eval timeout 200 $IG --block-t 64 --ways s13,64/64/4/1/2/0,128/64/4/1/2/0,128/64/4/1/3/0,128/64/8/1/2/0,128/64/4/1/0/0,64/64/8/1/2/0 \
  --json $R/ig64.json > $R/ig64.txt 2>&1; log "ig64 rc $?"
snap
wait $MK; log "made $(ls -la $G | awk '{print $5}')"
(cd /tmp && timeout 120 python3 $NEW/bench/gpu_box/prompt_graphs_load.py --model $G --modes auto --tokens 1000,1500,2000 \
  --alone 1024,2048 --ctx 4096 --json $R/graphs_new.json > $R/graphs_new.txt 2>&1); log "graphs new rc $?"
snap
(cd /tmp && PYTHONPATH=/tmp/site:$OLD timeout 120 python3 $NEW/bench/gpu_box/prompt_graphs_load.py --model $G --modes auto \
  --tokens 1000,1500,2000 --alone 1024 --ctx 4096 --json $R/graphs_old.json > $R/graphs_old.txt 2>&1); log "graphs old rc $?"
snap
