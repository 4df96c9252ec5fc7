# moe16 (session 8): the one H200 call. Run from the repo root with carry [".whl", ".xfer/moe16"].
cd .xfer/moe16
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
L=$OUT/moe16_h200_s8; mkdir -p $L
trap 'tar czf $OUT/moe16_h200_s8.tgz -C $OUT moe16_h200_s8' EXIT
END=${END:-140}
step() { local cap=$1; shift; local left=$((END - SECONDS)); [ $left -lt $cap ] && cap=$left; [ $cap -gt 5 ] && timeout $cap "$@"; echo "rc=$? at ${SECONDS}s: $*" >> $L/steps.txt; }
nvidia-smi -L > $L/device.txt 2>&1; cp COMMIT $L/commit.txt
step 55 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_moe_words_full.py tests/engine/test_moe_down_full.py \
  tests/engine/test_moe_tiles.py -k "Q4_K or words or three or vectors or cuda-Q8_0" > $L/tests.log 2>&1
B="python3 bench/moe_tiles_bench.py --compile-workers 12"
step 60 env PYTHONPATH=$PYTHONPATH:$PWD/bench $B --types Q8_0,Q4_K --sets s7 --gate-up "" --down "" \
  --json $L/before_after.json > $L/before_after.log 2>&1
step 60 env PYTHONPATH=$PYTHONPATH:$PWD/bench $B --types Q4_K --sets new --gate-up 8/1/1/e,4/1/2/e,8/2/1/e \
  --down 4/1/2/e/8,8/1/2/e/4 --json $L/q4k_candidates.json > $L/q4k_candidates.log 2>&1
