#!/usr/bin/env bash
# Session 47, call 5 (carry [".whl"]): a prompt whose MoE layers take the slab experts runs eagerly (PromptForward's
# _slab_experts, from call 4: the eager slabs beat the graphs' grouped GEMMs). The GPU tests of the slabs and the
# prompt graphs; prefill_bench.py's eager forward against its prompt graphs (now eager where the slabs run) on the three
# models; and, measurement only, graphs that capture the slabs (the rule and MoE's capture check patched off:
# *_gslab.txt).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
M=/var/tmp/deepseek-v3-5l-16e-Q4_K.gguf; Q=/var/tmp/qwen3-30b-a3b-12l-Q4_K.gguf; G=/var/tmp/gpt-oss-20b-4l-F16.gguf
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part "${@:2}" --quiet && mv $1.part $1; }; }
(mk $Q --preset qwen3-30b-a3b --layers 12 --quant Q4_K
 mk $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4
 mk $M --preset deepseek-v3 --experts 16 --layers 5 --quant Q4_K) > $R/make.log 2>&1 & MK=$!
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_slab_gemm.py \
  tests/engine/test_cuda_graphs.py tests/engine/test_prompt_cache.py tests/engine/test_prompt_chunks.py \
  > $R/t_slab.txt 2>&1
log "tests rc $? $(tail -n 1 $R/t_slab.txt)"; grep -E "^(FAILED|ERROR)|Error" $R/t_slab.txt | head -20 >> $OUT/log.txt
snap
wait $MK; log "made"
PATCHED='import sys, runpy, torch
sys.path.insert(0, "bench/gpu_box")
from sparkd.engine.prompt_graphs import PromptForward
PromptForward._slab_experts = lambda self, rows: False
torch.cuda.is_current_stream_capturing = lambda: False
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")'
for m in $Q $G $M; do
  b=$(basename $m .gguf)
  timeout 80 python3 bench/gpu_box/prefill_bench.py --model $m --tokens 512,1024,2048 --variants int8,graphs2k,int8 \
    --profile '' --json $R/${b}_graphs.json > $R/${b}_graphs.txt 2>&1
  log "$b graphs rc $?"; grep "tok/s" $R/${b}_graphs.txt >> $OUT/log.txt
  timeout 60 python3 -c "$PATCHED" bench/gpu_box/prefill_bench.py --model $m --tokens 512,1024,2048 \
    --variants graphs2k --profile '' --json $R/${b}_gslab.json > $R/${b}_gslab.txt 2>&1
  log "$b graphs with slabs rc $?"; grep "tok/s" $R/${b}_gslab.txt >> $OUT/log.txt; tail -n 3 $R/${b}_gslab.txt >> $OUT/log.txt
  snap
done
