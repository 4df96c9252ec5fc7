#!/usr/bin/env bash
# Session 33, call 2 (H200, carry [".whl", ".cache"]): a DeepSeek-V4-Flash-shaped decode after the fused
# hyper-connections and the rope table (this tree) against the tree of call 1's change (.cache/mid: 74339d7) and the
# tree before the session (.cache/old: b39abe7); its eager step profiled (decode_profile.py --eager-only); the GPU
# tests of the changed paths. Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
NEW=/tmp/site:$PWD
MID=/tmp/site:$PWD/.cache/mid
OLD=/tmp/site:$PWD/.cache/old
export PYTHONPATH=$NEW
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
D=/var/tmp/deepseek-v4-flash-5l-16e-Q4_K.gguf
K=/var/tmp/kimi-k3-5l-32e-Q4_K.gguf
[ -f $D ] || python3 -m sparkd.engine.cli make-model $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --quiet &
[ -f $K ] || python3 -m sparkd.engine.cli make-model $K --preset kimi-k3 --experts 32 --layers 5 --quant Q4_K --quiet &
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_hyper_conn.py tests/engine/test_deepseek4.py \
    tests/engine/test_fused_kernels.py tests/engine/test_kernel_engine.py -k "hyper or deepseek4 or model_activations" \
    > $R/tests.txt 2>&1; echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
wait
log "models: $(ls /var/tmp/*.gguf | tr '\n' ' ')"
gen() {  # tag pythonpath model [flags...]
  local tag=$1 pp=$2 m=$3; shift 3
  PYTHONPATH=$pp timeout 150 python3 -m sparkd.engine.cli generate $m --device cuda --json "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$tag.json) $(grep -o '"prompt_tok_s": [0-9.]*' $R/gen_$tag.json)"
}
for r in 1 2; do
  gen dsv4_new_$r $NEW $D --resident --tokens 1,2,3,4,5,6,7,8 -n 64
  gen dsv4_mid_$r $MID $D --resident --tokens 1,2,3,4,5,6,7,8 -n 64
  gen dsv4_old_$r $OLD $D --resident --tokens 1,2,3,4,5,6,7,8 -n 64
  snap
done
SPARKD_FUSED_KERNELS=rms_norm,rope_kv,attention,router,norm_quant,norm_fold,rope_attention gen dsv4_new_nohc $NEW $D \
  --resident --tokens 1,2,3,4,5,6,7,8 -n 64
gen dsv4_stream_new $NEW $D --budget 4G --tokens 1,2,3,4,5,6,7,8 -n 32
gen k3_new $NEW $K --resident --tokens 1,2,3,4,5,6,7,8 -n 64
snap
timeout 150 python3 bench/gpu_box/decode_profile.py --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K \
  --dir /var/tmp --eager-only --tokens 32 --py-top 25 --json $R/profile_dsv4.json > $R/profile_dsv4.txt 2>&1
log "profile dsv4 rc $?"
timeout 150 python3 bench/gpu_box/decode_profile.py --preset kimi-k3 --experts 32 --layers 5 --quant Q4_K \
  --dir /var/tmp --eager-only --tokens 32 --py-top 25 --json $R/profile_k3.json > $R/profile_k3.txt 2>&1
log "profile k3 rc $?"
snap
