#!/usr/bin/env bash
# Session 41, call 4: after 234f0c5: sinks' continuations take the boolean mask (call 3: the bottom-right mask over the
# sink key gave other bits than it on the H100). The GPU tests the sink key touches, whole.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD
tst() {  # tag timeout files/args...
  local tag=$1 t=$2; shift 2
  timeout $t python3 -m pytest -q -p no:cacheprovider -m gpu "$@" > $R/t_$tag.txt 2>&1
  log "tests $tag rc $? $(tail -n 1 $R/t_$tag.txt)"
}
tst sdpa 60 tests/engine/test_fused_kernels.py -k "attend"
snap
tst graphs 200 tests/engine/test_cuda_graphs.py tests/engine/test_prompt_cache.py
snap
tst engine 150 tests/engine/test_kernel_engine.py -k "oss or gpt or sink or swa"
snap
