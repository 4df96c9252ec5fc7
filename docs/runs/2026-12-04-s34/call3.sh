#!/usr/bin/env bash
# Session 34, call 3 (H200, carry [".whl", ".cache"]): DeepSeek V4's resident graph step with wo_a from the file's
# blocks (the grouped GEMV) and rms_normalize fused, against 910b439 (.cache/old: call 1's tree) side by side; the
# new tree's graph replay profile; the GPU tests of the grouped GEMV and DeepSeek V4's replays.
# Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; OLD=$PWD/.cache/old
D=/var/tmp/deepseek-v4-flash-5l-16e-Q4_K.gguf
export PYTHONPATH=/tmp/site:$NEW
[ -f $D ] || python3 -m sparkd.engine.cli make-model $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --quiet
log "model made"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_kernels.py tests/engine/test_cuda_graphs.py \
  tests/engine/test_deepseek4_fused.py tests/engine/test_fused_kernels.py \
  -k "grouped_gemv or replay_equals_eager or deepseek4 or rms_norm" > $R/tests.txt 2>&1; echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
snap
gen() {  # tag tree [args...]
  local tag=$1 tree=$2; shift 2
  # (from /tmp: `python3 -m` puts the working directory first on sys.path, which would shadow the tree asked for)
  (cd /tmp && PYTHONPATH=/tmp/site:$tree timeout 150 python3 -m sparkd.engine.cli generate $D --device cuda --resident \
    --json "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ')"
}
for tree in $NEW $OLD; do
  log "tree $tree: $(cd /tmp && PYTHONPATH=/tmp/site:$tree python3 -c 'import sparkd; print(sparkd.__file__)')"
done
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
for r in 1 2 3; do
  gen new_$r $NEW --tokens 1,2,3,4,5,6,7,8 -n 128
  gen old_$r $OLD --tokens 1,2,3,4,5,6,7,8 -n 128
done
snap
gen new_long $NEW --tokens $LT -n 128 --ctx 4096
gen old_long $OLD --tokens $LT -n 128 --ctx 4096
snap
cd bench/gpu_box
timeout 200 python3 decode_profile.py --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --dir /var/tmp \
  --tokens 64 --profile-tokens 8 --json $R/profile_dsv4.json > $R/profile_dsv4.txt 2>&1
log "profile rc $?"
snap
