set -u
cd .xfer/moe12
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
T0=$(date +%s)
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 85 python3 bench/moe_tiles_bench.py --compile-workers 12 --sets s6b \
  --gate-up "" --down 4/1/1/g/4:wpvVo,2/1/1/g/8:wpvVo,4/1/3/e/4:wpvVo,4/1/1/e/8:wpvVo \
  --json $OUT/moe12_h200_s7.json > $OUT/moe12_h200_s7.log 2>&1
echo "bench rc=$? $(( $(date +%s) - T0 )) s"
T0=$(date +%s)
timeout 80 python3 -m pytest -q -m gpu tests/engine/test_moe_tiles.py > $OUT/moe12_h200_s7_tests_tiles.log 2>&1 &
timeout 80 python3 -m pytest -q -m gpu tests/engine/test_moe_decode_fusion.py > $OUT/moe12_h200_s7_tests_fusion.log 2>&1 &
wait
echo "tests $(( $(date +%s) - T0 )) s"
tail -3 $OUT/moe12_h200_s7_tests_*.log
grep -E "all|FAILED" $OUT/moe12_h200_s7.log | head -80
