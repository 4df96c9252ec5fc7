# fold20 (session 9): the one H200 call. From the repo root with carry [".whl", ".xfer/fold20"]:
#   cd .xfer/fold20 && bash bench/results/fold20_h200_s9_call.sh
# The GPU tests of the norm fold (test_norm_fold, test_split_fold) run while 12 processes compile the bench's
# kernels; then, alone on the GPU, the dense GEMV (x quantized before, as the engine runs it) at the engine's
# o projection (2048x4096), q (4096x2048) and the dense shapes 6144x4096 / 4096x14336: split choices with and
# without the in-launch fold ("n": no fold, times only), and GEMV + the add/norm launch that reads y next,
# with the fold in the GEMV vs the partials added by the norm (fused "norm_fold").
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
L=$OUT
END=${END:-105}
log() { echo "[+${SECONDS}s] $*" >> $L/steps.txt; }
cap() { local left=$((END - SECONDS)); [ $left -lt 1 ] && left=1; [ $left -lt $1 ] && echo $left || echo $1; }
nvidia-smi -L > $L/steps.txt 2>&1
timeout $(cap 55) python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_norm_fold.py \
  tests/engine/test_split_fold.py > $L/tests.log 2>&1 & P=$!
ROWS="Q8_0P@2/1/4/e/2,Q8_0P@2/1/4/en/2,Q8_0P@2/1/4/e/4,Q8_0P@2/1/4/en/4,Q8_0P@4/1/2/e/1"
ROWS="$ROWS,Q4T@pairx:4/1/2/e/1,Q4T@pairx:4/1/2/e/2,Q4T@pairx:4/1/2/en/2,Q4T@pairx:4/1/2/e/4,Q4T@pairx:4/1/2/en/4"
ROWS="$ROWS,Q4T@pairx:4/1/2/e/8,Q4T@pairx:4/1/2/en/8"
CONS="Q8_0P@default,Q8_0P@2/1/4/e/2,Q4T@default,Q4T@pairx:4/1/2/e/8"
B="bench/gemv_tiles_bench.py --types Q8_0P,Q4T --qx --no-act-quant --defaults-only --rows $ROWS --consumer $CONS"
B="$B --shapes 2048x4096,4096x2048,6144x4096,4096x14336"
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout $(cap 45) python3 $B --compile-workers 12 --compile-only > $L/compile.log 2>&1
log "compile rc $?: $(tail -1 $L/compile.log)"
wait $P; log "tests rc $?: $(tail -1 $L/tests.log)"
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout $(cap 60) python3 $B --json $L/gemv.json > $L/gemv.log 2>&1
log "gemv rc $?"
