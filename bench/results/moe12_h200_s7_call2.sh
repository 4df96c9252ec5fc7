set -u
cd .xfer/moe12
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout 70 python3 bench/moe_tiles_bench.py --compile-workers 12 --sets s6b \
  --gate-up "" --down 4/1/1/g/1:wpvV,4/1/1/g/2:wpvV \
  --json $OUT/moe12_h200_s7_call2.json > $OUT/moe12_h200_s7_call2.log 2>&1
echo "bench rc=$? $(( $(date +%s) - T0 )) s"
grep -E "top8 (all|gate|down)|same-bytes|FAILED" $OUT/moe12_h200_s7_call2.log | cut -c1-110 | head -120
