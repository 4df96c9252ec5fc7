#!/usr/bin/env bash
# Session 36, calls 3 and 4 (4: the dot on a [BN, 256] tile): call 2 found the F16 / BF16 GEMV at 0.18-0.20 of copy bandwidth (the dequant path, a reduction
# every group) against torch.mv's 0.89-0.91. With half.py's dot (elementwise tile): the tiles swept, then the GPU tests
# of the half families again. carry [".whl", ".cache"].
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res3; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res3; }
export PYTHONPATH=/tmp/site:$PWD
timeout 300 python3 bench/gpu_box/half_gemv_sweep.py --json $R/sweep.json > $R/sweep.txt 2>&1
log "sweep rc $?"
cat $R/sweep.txt | tee -a $OUT/log.txt
snap
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_kernels.py tests/engine/test_kernel_engine.py \
  -k "F16 or half or 16_bit or embedding" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
snap
