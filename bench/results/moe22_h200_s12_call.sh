#!/usr/bin/env bash
# Session 12, moe22 (H200, one call, at commit 654e023: the split gate/up there, removed after this measurement): the MoE gate/up with its K in ranges (GemvConfig.split of the gate/up tile,
# moe._igate_up_kernel's KSPLIT; default split 2 below width 4096, "s11" = the default before) at 2048x768 and
# 4096x1536 top-8, Q8_0, Q4_K (GGUF, streamed experts) and Q4_KX (gate/up pairx, the resident default), split
# candidates beside the sets s11 and new (each also as the engine's layer, "all qx"); 7168x2048 defaults only (the
# same tiles in both sets); the GPU tests of the files touched first (2 groups, the 12-layer Q4_K model written
# meanwhile), then the resident decode of that model at s11, new (split 2) and new:4 (split 4), interleaved
# (pdl_decode.py --moe-tiles). Run from .xfer/moe22, carry [".whl", ".xfer/moe22"]; all in $OUT/moe22_h200_s12.tar.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
D=/tmp/moe22; mkdir -p $D
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }; log() { echo "[+$(el)s] $*" | tee -a $D/call.txt; }
snap() { tar -C $D -cf $OUT/moe22_h200_s12.tar . 2>/dev/null; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > $D/gpu.txt 2>&1
M=/tmp/q30-12l-Q4_K.gguf
(timeout 110 nice -n 10 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K --quiet \
  --layers 12 && mv $M.part $M) > $D/make.log 2>&1 &
E=tests/engine; TP="$PYTHONPATH:$PWD/tests/engine:$PWD/tests:$PWD/bench"
PYTHONPATH=$TP timeout 42 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE $E/test_moe_gate_up_split.py \
  $E/test_moe_tiles.py > $D/tests_1.log 2>&1 & P1=$!
PYTHONPATH=$TP timeout 42 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE $E/test_moe_tiled.py \
  $E/test_moe_words_full.py $E/test_moe_decode_fusion.py::test_kernels_read_the_selection_as_the_gathered_offsets \
  > $D/tests_2.log 2>&1 & P2=$!
wait $P1; log "tests 1 rc $? $(tail -1 $D/tests_1.log)"
wait $P2; log "tests 2 rc $? $(tail -1 $D/tests_2.log)"; snap
GU="Q8_0@2/1/2/e/4,Q8_0@2/1/1/e/2,Q8_0@2/1/1/e/4,Q8_0@2/1/2/e/2,Q4_K@4/1/1/e/2,Q4_K@4/1/1/e/4,"
GU+="Q4_KX@4/1/1/e/2,Q4_KX@4/1/1/e/4,Q4_KX@4/1/1/e/8,Q4_KX@4/1/2/e/2"
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 62 python3 bench/moe_tiles_bench.py --compile-workers 14 --types Q8_0,Q4_K,Q4_KX \
  --sets s11 --shapes 2048x768x8,4096x1536x8 --no-twins --gate-up "$GU" --down "" \
  --json $D/moe22_h200_s12.json > $D/moe22_h200_s12.log 2>&1
log "bench rc $?"; snap
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 22 python3 bench/moe_tiles_bench.py --types Q8_0,Q4_KX --sets s11 \
  --shapes 7168x2048x8 --no-twins --defaults-only --json $D/moe22_h200_s12_7168.json > $D/moe22_h200_s12_7168.log 2>&1
log "bench 7168 rc $?"; snap
wait
log "model $(ls -la $M 2>&1 | awk '{print $5}') $(tail -2 $D/make.log)"
PYTHONPATH=$PYTHONPATH:$PWD/bench/gpu_box timeout 40 python3 bench/gpu_box/pdl_decode.py --quant Q4_K --layers 12 \
  --tokens 128 --forced 16 --moe-tiles s11,new,new:4 --repeats 3 --json $D/decode_Q4_K.json > $D/decode_Q4_K.log 2>&1
log "decode rc $?: $(tail -1 $D/decode_Q4_K.log)"
snap
