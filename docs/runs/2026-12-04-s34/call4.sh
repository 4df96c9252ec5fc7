#!/usr/bin/env bash
# Session 34, call 4 (H200, carry [".whl", ".cache"]): the session's DeepSeek V4 changes (wo_a from the file's blocks,
# rms_normalize fused, the norms' shared x blocks, the compressor in one launch) against 910b439 (.cache/old: calls 1
# and 2's tree, after the streamed segments) side by side, resident and streamed; llama-bench built with CUDA
# (cuda_side_by_side.sh BUILD_ONLY=1) on the same files; the GPU tests of this session's kernels and graphs.
# Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW
W=/var/tmp/sparkd-cuda; mkdir -p $W
OUT=$R/llama WORK=$W BUILD_ONLY=1 bash bench/gpu_box/cuda_side_by_side.sh > $R/llama_build.log 2>&1 & LB=$!
D=/var/tmp/deepseek-v4-flash-5l-16e-Q4_K.gguf
K=/var/tmp/kimi-k3-5l-32e-Q4_K.gguf
[ -f $D ] || python3 -m sparkd.engine.cli make-model $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --quiet
[ -f $K ] || python3 -m sparkd.engine.cli make-model $K --preset kimi-k3 --experts 32 --layers 5 --quant Q4_K --quiet
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_deepseek4_fused.py tests/engine/test_cuda_graphs.py \
  tests/engine/streaming/test_graph_step.py -k "compressor or deepseek4 or replay_equals_eager or own_streams or kimi" \
  > $R/tests.txt 2>&1; echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
wait $LB
log "llama build: $(tail -2 $R/llama_build.log | tr '\n' ' ')"
snap
L=$W/llama-cuda/llama-bench
for m in D K; do
  f=${!m}
  timeout 100 $L -o json -m $f -ngl 99 -p 0 -n 128 -d 0,2000 -r 2 > $R/llama_$m.json 2> $R/llama_$m.err
  log "llama-bench $m rc $?: $(grep -o '"n_depth": [0-9]*\|"avg_ts": [0-9.e+]*' $R/llama_$m.json | tr '\n' ' ')"
done
snap
gen() {  # tag tree model [args...]; from /tmp: `python3 -m` puts the working directory first on sys.path
  local tag=$1 tree=$2 m=$3; shift 3
  (cd /tmp && PYTHONPATH=/tmp/site:$tree timeout 100 python3 -m sparkd.engine.cli generate $m --device cuda --json \
    "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ')"
}
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
for r in 1 2; do
  gen dsv4_new_$r $NEW $D --resident --tokens 1,2,3,4,5,6,7,8 -n 128
  gen dsv4_old_$r $OLD $D --resident --tokens 1,2,3,4,5,6,7,8 -n 128
done
gen dsv4_new_long $NEW $D --resident --tokens $LT -n 128 --ctx 4096
gen k3_new $NEW $K --resident --tokens 1,2,3,4,5,6,7,8 -n 128
gen k3_old $OLD $K --resident --tokens 1,2,3,4,5,6,7,8 -n 128
snap
gen dsv4_stream_new $NEW $D --budget 4G --tokens 1,2,3,4,5,6,7,8 -n 64
gen dsv4_stream_old $OLD $D --budget 4G --tokens 1,2,3,4,5,6,7,8 -n 64
snap
cd bench/gpu_box
timeout 100 python3 decode_profile.py --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --dir /var/tmp \
  --tokens 32 --profile-tokens 8 --json $R/profile_dsv4.json > $R/profile_dsv4.txt 2>&1
log "profile rc $?"
snap
