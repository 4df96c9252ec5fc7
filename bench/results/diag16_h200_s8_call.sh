#!/usr/bin/env bash
# Session 8, diag16 (H200, one call; carry [".whl", ".xfer/diag16"]; run from /work/main's tree as
# `cd .xfer/diag16 && bash bench/results/diag16_h200_s8_call.sh`): main's bits at the defaults saved by
# main's tree (the repo root) and compared by this branch's, with the GPU tests of the tiles the row sums
# admit (five pytest processes side by side), then the GEMV and MoE rows of the newly admitted tiles.
set -u
export PYTHONUNBUFFERED=1
ROOT=$(cd ../.. && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
L=$OUT/d; mkdir -p $L
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $L/log.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt 2>&1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" >> $L/gpu.txt 2>&1
( PYTHONPATH=/tmp/site:$ROOT:$ROOT/bench timeout 50 python3 bench/diag16_bits.py save /tmp/main_bits.pt \
  && PYTHONPATH=/tmp/site:$PWD:$PWD/bench timeout 30 python3 bench/diag16_bits.py compare /tmp/main_bits.pt ) > $L/bits.log 2>&1 &
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench:$PWD/tests/engine
P="timeout 55 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE"
$P tests/engine/test_row_tiles.py -k "every_tile or row_sums" > $L/t_rule.log 2>&1 &
$P tests/engine/test_q4_k_tiled.py -k gguf_bits > $L/t_q4t.log 2>&1 &
$P tests/engine/test_q6_k_tiled.py > $L/t_q6t.log 2>&1 &
$P tests/engine/test_gemv_split.py tests/engine/test_moe_tiles.py -k "part_of_a_tile or headers_as_vectors" > $L/t_split_moe.log 2>&1 &
$P tests/engine/test_row_tiles.py -k "not every_tile and not row_sums" > $L/t_rowtiles.log 2>&1 &
wait
for f in bits t_rule t_q4t t_q6t t_split_moe t_rowtiles; do log "$f: $(tail -1 $L/$f.log)"; done
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
timeout 45 python3 bench/gemv_tiles_bench.py --types Q4T,Q6T --shapes 4096x2048,6144x4096,14336x4096 \
  --q4t-rows bytes:4/2/4/e,bytes:2/1/4/e,bytes:2/1/8/e,bytes:4/2/2/e --qx --no-act-quant \
  --compile-workers 14 --json $L/gemv.json > $L/gemv.log 2>&1
log "gemv rc $?"
timeout 38 python3 bench/moe_tiles_bench.py --types Q4_K --shapes 2048x768x8,4096x1536x8 --gate-up 2/1/1/e,2/1/2/e \
  --down 2/1/2/e/4,2/1/3/e/8,2/1/2/e/2 --sets new --no-twins --compile-workers 14 --json $L/moe.json > $L/moe.log 2>&1
log "moe rc $?"
tar czf $OUT/diag16_logs.tgz -C $L . && cp $L/log.txt $OUT/log.txt; ls $OUT
