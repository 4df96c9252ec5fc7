#!/usr/bin/env bash
# Session 10, moe21 (H200, one call): the Q4_K MoE down on experts repacked into the pairx bytes (moe.tiled_down;
# bench type Q4_KXD: gate/up and down packed) against the default before it (Q4_KX: gate/up packed, down GGUF),
# each beside its load-only twin (bench/moe_twin.py: the pair tile's loads vs the GGUF rows' words), Q8_0 as the
# control, at 7168x2048, 4096x1536, 2048x768; down tile candidates for the tiled down. The GPU tests of the files
# touched first (3 groups in parallel, a 12-layer Q4_K model written meanwhile), then the resident Q4_K decode with
# the tiled down (default) and SPARKD_MOE_DOWN_LAYOUT=gguf, if time is left. Run from .xfer/moe21, carry
# [".whl", ".xfer/moe21"]; everything lands in $OUT/moe21_h200_s10.tar.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
D=/tmp/moe21; mkdir -p $D; W=/var/tmp/moe21; mkdir -p $W
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }; log() { echo "[+$(el)s] $*" | tee -a $D/call.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > $D/gpu.txt 2>&1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" >> $D/gpu.txt 2>&1
M=$W/q3-12-Q4_K.gguf
(timeout 110 nice -n 10 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K --quiet \
  --layers 12 && mv $M.part $M) > $D/make.log 2>&1 &
E=tests/engine; TP="$PYTHONPATH:$PWD/tests/engine:$PWD/tests:$PWD/bench"
i=0; P=()
for g in "$E/test_moe_tiled.py" "$E/test_moe_twin.py $E/test_moe_down_full.py" "$E/test_kernel_engine.py -k tiled_q4_k"; do
  i=$((i+1)); PYTHONPATH=$TP timeout 70 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE $g > $D/tests_$i.log 2>&1 & P+=($!)
done
for j in 0 1 2; do wait ${P[$j]}; log "tests $((j+1)) rc $? $(tail -1 $D/tests_$((j+1)).log)"; done
C="4/1/1/e/2 4/1/2/e/2 4/1/2/e/4 4/1/1/e/4 4/1/2/e/8 4/1/4/e/2 4/1/2/e/2:wpvVf"
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 95 python3 bench/moe_tiles_bench.py --compile-workers 14 --types Q4_KX,Q4_KXD,Q8_0 \
  --sets new --shapes 7168x2048x8,4096x1536x8,2048x768x8 --gate-up "" --down "$(for t in $C; do printf 'Q4_KXD@%s,' $t; done)" \
  --json $D/moe21_h200_s10.json > $D/moe21_h200_s10.log 2>&1
log "bench rc $?"
log "model $(ls -la $M 2>&1 | awk '{print $5}')"
for layout in tiled gguf tiled gguf; do
  [ -f $M ] && [ $(el) -lt 150 ] || { log "resident $layout skipped"; continue; }
  SPARKD_MOE_DOWN_LAYOUT=$layout timeout 25 python3 -m sparkd.engine.cli generate $M --tokens 1,2,3,4,5,6,7,8 -n 128 \
    --device cuda --json --cuda-graphs on --resident > $D/res_$layout.json 2> $D/res_$layout.err
  log "resident down $layout rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $D/res_$layout.json)"
  cp $D/res_$layout.json $D/res_${layout}_$(el).json 2>/dev/null
done
tar -C $D -cf $OUT/moe21_h200_s10.tar .
