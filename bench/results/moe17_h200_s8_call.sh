# moe17 (session 8): the one H200 call. Run from the repo root with carry [".whl", ".xfer/moe17"].
cd .xfer/moe17
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
L=$OUT/moe17_h200_s8; mkdir -p $L
trap 'tar czf $OUT/moe17_h200_s8.tgz -C $OUT moe17_h200_s8' EXIT
END=${END:-150}
step() { local cap=$1; shift; local left=$((END - SECONDS)); [ $left -lt $cap ] && cap=$left; [ $cap -gt 5 ] && timeout $cap "$@"; echo "rc=$? at ${SECONDS}s: $*" >> $L/steps.txt; }
nvidia-smi -L > $L/device.txt 2>&1; cp COMMIT $L/commit.txt
step 40 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_moe_rows.py > $L/tests.log 2>&1
B="python3 bench/moe_tiles_bench.py --compile-workers 12"
step 100 env PYTHONPATH=$PYTHONPATH:$PWD/bench $B --types Q8_0 --sets new --gate-up "" \
  --down 1/1/1/g:wpfx,1/1/2/g:wpfx,1/1/1/e:wpfx,1/1/1/g:wpfxd --json $L/rows.json > $L/rows.log 2>&1
