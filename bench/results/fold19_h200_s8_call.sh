# fold19 (session 8): the one H200 call. Run from the repo root with carry [".whl", ".xfer/fold19"].
# The split-K fold's share: MoE downs (kernel, load-only twin, twin + the down's fold, the kernel with no fold
# "n", fewer ranges) and the tiled Q4_K GEMV at split 1/2/4/8, the wave rule's and no fold.
cd .xfer/fold19
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
L=$OUT/fold19_h200_s8; mkdir -p $L
trap 'tar czf $OUT/fold19_h200_s8.tgz -C $OUT fold19_h200_s8 && rm -rf $L' EXIT
END=${END:-112}
step() { local cap=$1; shift; local left=$((END - SECONDS)); [ $left -lt $cap ] && cap=$left; [ $cap -gt 5 ] && timeout $cap "$@"; echo "rc=$? at ${SECONDS}s: $*" >> $L/steps.txt; }
nvidia-smi -L > $L/device.txt 2>&1; cp COMMIT $L/commit.txt 2>/dev/null
DOWN="Q8_0@4/1/1/gn/8,Q8_0@2/1/2/en/8,Q8_0@4/1/1/g/4,Q8_0@4/1/1/g/2,Q8_0@2/1/2/e/4,Q8_0@2/1/2/e/2"
DOWN="$DOWN,Q4_K@4/1/3/en/8,Q4_K@4/1/2/en/4,Q4_K@4/1/2/en/2,Q4_K@4/1/3/e/4,Q4_K@4/1/3/e/2,Q4_K@4/1/2/e/2,Q4_K@4/1/2/e/1"
step 68 env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --compile-workers 14 --types Q8_0,Q4_K \
  --sets new --gate-up "" --down "$DOWN" --json $L/moe.json > $L/moe.log 2>&1
ROWS="bytes:4/1/2/e/1,bytes:4/1/4/e/1,bytes:4/1/4/e/2,bytes:4/1/4/e/4,bytes:4/1/4/e/8,bytes:4/1/4/en/0"
ROWS="$ROWS,loadonly:4/1/4/e/1,loadonly:4/1/4/e/2,loadonly:4/1/4/e/4,loadonly:4/1/4/e/8,loadonly:4/1/4/en/0"
step 44 env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/gemv_tiles_bench.py --compile-workers 14 --types Q4T --qx \
  --no-act-quant --shapes 4096x14336,6144x4096,4096x2048 --q4t-rows "$ROWS" --json $L/gemv.json > $L/gemv.log 2>&1
