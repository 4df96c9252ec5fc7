#!/usr/bin/env bash
# Session 47, call 3 (carry [".whl", ".cache"]): SLAB_EXPERT_ROWS 64 (from call 2). The GPU tests of the slab experts
# and the plan; then side by side with llama-bench built with CUDA from the vendored source (niced while the rest
# runs): the 5-layer DeepSeek-V3-shaped, 12-layer Qwen3-30B-A3B-shaped and 4-layer gpt-oss-20b models' prompts of 512,
# 2000 and 8000 tokens, sparkd's warm eager forwards (prompt_profile.py: the experts' slabs, and off) against
# llama-bench -p.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
W=/var/tmp/sparkd-cuda; mkdir -p $W
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
OUT=$R/llama WORK=$W BUILD_ONLY=1 nice -n 19 bash bench/gpu_box/cuda_side_by_side.sh > $R/llama_build.log 2>&1 & LB=$!
M=/var/tmp/deepseek-v3-5l-16e-Q4_K.gguf; Q=/var/tmp/qwen3-30b-a3b-12l-Q4_K.gguf; G=/var/tmp/gpt-oss-20b-4l-F16.gguf
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part "${@:2}" --quiet && mv $1.part $1; }; }
(mk $Q --preset qwen3-30b-a3b --layers 12 --quant Q4_K
 mk $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4
 mk $M --preset deepseek-v3 --experts 16 --layers 5 --quant Q4_K) > $R/make.log 2>&1 & MK=$!
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_slab_gemm.py \
  tests/engine/test_attention_memory.py tests/engine/test_prompt_chunks.py > $R/t_slab.txt 2>&1
log "tests rc $? $(tail -n 1 $R/t_slab.txt)"; grep -E "^(FAILED|ERROR)|Error" $R/t_slab.txt | head -20 >> $OUT/log.txt
snap
wait $MK; log "made: $(ls /var/tmp/*.gguf | tr '\n' ' ')"
for m in $M $Q $G; do
  b=$(basename $m .gguf)
  for n in 8000 2000 512; do
    timeout 60 python3 bench/gpu_box/prompt_profile.py $m --tokens $n --top 6 --repeats 3 \
      --ways mha,mha:::1000000000,mha --json $R/${b}_$n.json > $R/${b}_$n.txt 2>&1
    log "$b $n rc $?"; grep -v Warn $R/${b}_$n.txt | grep -v "^  " >> $OUT/log.txt
  done
  snap
done
wait $LB; log "llama build: $(tail -n 2 $R/llama_build.log | tr '\n' ' ')"
LBIN=$W/llama-cuda/llama-bench
for m in $M $Q $G; do
  b=$(basename $m .gguf)
  [ -x $LBIN ] && timeout 120 $LBIN -o json -m $m -ngl 99 -fa 0 -p 512,2000,8000 -n 0 -r 3 > $R/llama_$b.json \
    2> $R/llama_$b.err
  log "llama-bench $b rc $?: $(grep -o '"n_prompt": [0-9]*\|"avg_ts": [0-9.e+]*' $R/llama_$b.json 2>/dev/null | tr '\n' ' ')"
  snap
done
