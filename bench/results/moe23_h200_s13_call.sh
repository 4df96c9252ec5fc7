#!/usr/bin/env bash
# Session 13, moe23 (H200, one call): the MoE decode layer below width 7168 and PDL's overlap of its two launches.
# moe_tiles_bench.py's "all qx" layer (x quantized before; gate/up + down as the engine runs them) at the default
# tiles with --variants off (PDL off), late (the gate/up lets the down launch only after its loop:
# Kernels.down_at_start False), again (the default once more), and down candidates with fewer, longer programs
# (each timed alone and as the layer); resident layouts: 2048x768 Q8_0 + Q4_KX, 4096x1536 Q8_0 + Q4_KXD, 7168x2048
# defaults + variants. GPU tests of the files touched first (the 12-layer Q4_K model written meanwhile), then the
# resident decode at new / new+late interleaved (pdl_decode.py --moe-tiles). Run from .xfer/moe23, carry
# [".whl", ".xfer/moe23"]; all in $OUT/moe23_h200_s13.tar. Ran at commit 31547a0, where "new+late" was the gate/up
# launching the down after its loop everywhere (at the head: new+loop; the 2048-wide default now).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
D=/tmp/moe23; mkdir -p $D
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }; log() { echo "[+$(el)s] $*" | tee -a $D/call.txt; }
left() { local r=$(( ${LIMIT:-195} - $(el) )); echo $(( r < $1 ? (r > 5 ? r : 5) : $1 )); }  # a step's timeout
snap() { tar -C $D -cf $OUT/moe23_h200_s13.tar . 2>/dev/null; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > $D/gpu.txt 2>&1
M=/tmp/q30-12l-Q4_K.gguf
(timeout 110 nice -n 10 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K --quiet \
  --layers 12 && mv $M.part $M) > $D/make.log 2>&1 &
E=tests/engine; TP="$PYTHONPATH:$PWD/tests/engine:$PWD/tests:$PWD/bench"
PYTHONPATH=$TP timeout 38 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
  $E/test_moe_tiles.py::test_new_tiles_give_the_old_tiles_sums > $D/tests_1.log 2>&1 & P1=$!
PYTHONPATH=$TP timeout 38 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
  $E/test_moe_tiled.py::test_tiled_down_within_the_fp32_bound > $D/tests_2.log 2>&1 & P2=$!
wait $P1; log "tests 1 rc $? $(tail -1 $D/tests_1.log)"
wait $P2; log "tests 2 rc $? $(tail -1 $D/tests_2.log)"; snap
B="timeout"; BP="$PYTHONPATH:$PWD/bench"
PYTHONPATH=$BP $B $(left 48) python3 bench/moe_tiles_bench.py --compile-workers 14 --types Q8_0,Q4_KX --sets new \
  --shapes 2048x768x8 --no-twins --variants off,late,again --gate-up "" \
  --down "Q8_0@4/1/1/g/4,Q8_0@4/1/1/g/2,Q8_0@2/1/2/e/1,Q4_KX@4/1/3/e/2,Q4_KX@4/1/3/e/1" \
  --json $D/moe23_h200_s13_2048.json > $D/moe23_h200_s13_2048.log 2>&1
log "bench 2048 rc $?"; snap
PYTHONPATH=$BP $B $(left 48) python3 bench/moe_tiles_bench.py --compile-workers 14 --types Q8_0,Q4_KXD --sets new \
  --shapes 4096x1536x8 --no-twins --variants off,late,again --gate-up "" \
  --down "Q8_0@4/1/1/g/2,Q8_0@2/1/2/e/1,Q8_0@2/1/4/e/1,Q4_KXD@4/1/2/e/2,Q4_KXD@4/1/2/e/1" \
  --json $D/moe23_h200_s13_4096.json > $D/moe23_h200_s13_4096.log 2>&1
log "bench 4096 rc $?"; snap
wait
log "model $(ls -la $M 2>&1 | awk '{print $5}') $(tail -1 $D/make.log)"
PYTHONPATH=$PYTHONPATH:$PWD/bench/gpu_box $B $(left 40) python3 bench/gpu_box/pdl_decode.py --quant Q4_K --layers 12 \
  --tokens 128 --forced 16 --moe-tiles new,new+late --repeats 3 --json $D/decode_Q4_K.json > $D/decode_Q4_K.log 2>&1
log "decode rc $?: $(tail -1 $D/decode_Q4_K.log)"; snap
PYTHONPATH=$BP $B $(left 25) python3 bench/moe_tiles_bench.py --types Q8_0,Q4_KXD --sets new --shapes 7168x2048x8 \
  --no-twins --defaults-only --variants off,late,again --json $D/moe23_h200_s13_7168.json > $D/moe23_h200_s13_7168.log 2>&1
log "bench 7168 rc $?"
snap
