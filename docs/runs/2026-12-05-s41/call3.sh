#!/usr/bin/env bash
# Session 41, call 3 (carry [".whl", ".cache"], .cache/old = f7538a7's sparkd: the half GEMV fix, gpt-oss prompts on
# attend): gpt-oss's sinks through SDPA (4c561fa). The bench of attend against attend_sdpa with sinks (the efficient
# kernel alone), the GPU tests it touches, then gpt-oss-20b-shaped 4-layer F16 prompts of 8000 and 2000 tokens, new /
# old interleaved after an untimed warm-up. Each step snapshots.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
python3 -m sparkd.engine.cli make-model $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4 \
  --quiet > $R/make.log 2>&1 &
MK=$!
timeout 120 python3 bench/gpu_box/sink_sdpa_bench.py --json $R/sink_sdpa.json > $R/sink_sdpa.txt 2>&1
log "sink_sdpa rc $?"; snap
tst() {  # tag timeout files/args...
  local tag=$1 t=$2; shift 2
  timeout $t python3 -m pytest -q -p no:cacheprovider -m gpu "$@" > $R/t_$tag.txt 2>&1
  log "tests $tag rc $? $(tail -n 1 $R/t_$tag.txt)"
}
tst sdpa 60 tests/engine/test_fused_kernels.py -k "attend_sdpa"
tst mem 120 tests/engine/test_attention_memory.py
tst swa 60 tests/engine/test_swa_ring.py tests/engine/test_prompt_chunks.py
snap
wait $MK; log "made $(ls -la $G | awk '{print $5}')"
gen() {  # tag tree [env...] -- args
  local tag=$1 tree=$2; shift 2
  (cd /tmp && env PYTHONPATH=/tmp/site:$tree "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*' $R/gen_$tag.json | tr '\n' ' ')"
}
GEN="timeout 80 python3 -m sparkd.engine.cli generate --device cuda --json --resident"
L2=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
L8=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
gen warm_new $NEW $GEN $G --tokens $L8 -n 8
gen warm_old $OLD $GEN $G --tokens $L8 -n 8
for r in 1 2; do
  gen p8k_new_$r $NEW $GEN $G --tokens $L8 -n 16
  gen p8k_old_$r $OLD $GEN $G --tokens $L8 -n 16
done
gen p2k_new_1 $NEW $GEN $G --tokens $L2 -n 16
gen p2k_old_1 $OLD $GEN $G --tokens $L2 -n 16
snap
tst graphs 150 tests/engine/test_cuda_graphs.py tests/engine/test_kernel_engine.py -k "oss or gpt or sink"
snap
