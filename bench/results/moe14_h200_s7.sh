set -u
cd .xfer/moe14
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 80 python3 bench/moe_tiles_bench.py --types Q8_0,Q4_K --compile-workers 12 \
  --sets s7 --gate-up "" --down "" --json $OUT/moe14_h200_s7.json > $OUT/moe14_h200_s7.log 2>&1
echo "bench rc=$? $(( $(date +%s) - T0 )) s"
T0=$(date +%s)
timeout 40 python3 -m pytest -q -m gpu tests/engine/test_moe_tiles.py tests/engine/test_moe_words_full.py tests/engine/test_moe_down_full.py > $OUT/moe14_h200_s7_tests_tiles.log 2>&1 &
timeout 40 python3 -m pytest -q -m gpu tests/engine/test_moe_decode_fusion.py > $OUT/moe14_h200_s7_tests_fusion.log 2>&1 &
wait
echo "tests $(( $(date +%s) - T0 )) s"
tail -3 $OUT/moe14_h200_s7_tests_*.log
grep -E "top8 (all|gate|down)|same-bytes|twin|FAILED|Error" $OUT/moe14_h200_s7.log | cut -c1-130 | head -80
