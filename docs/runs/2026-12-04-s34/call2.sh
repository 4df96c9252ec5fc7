#!/usr/bin/env bash
# Session 34, call 2 (H200, carry [".whl"]): (1) where DeepSeek V4's resident graph step goes, kernel by kernel
# (decode_profile.py's graph replay profile; session 33 left it at 0.84-0.86 of llama.cpp); (2) the streamed decode as
# a DGX Spark runs it: --unified on (zero-copy from the pinned host arena, no VRAM cache) under budgets that hold
# ~60-70 % of the experts, so experts are read per token: the eager step against the graph segments.
# Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
D=/var/tmp/deepseek-v4-flash-5l-16e-Q4_K.gguf
K=/var/tmp/kimi-k3-5l-32e-Q4_K.gguf
[ -f $D ] || python3 -m sparkd.engine.cli make-model $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --quiet
[ -f $K ] || python3 -m sparkd.engine.cli make-model $K --preset kimi-k3 --experts 32 --layers 5 --quant Q4_K --quiet
log "models made"
cd bench/gpu_box
timeout 200 python3 decode_profile.py --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K --dir /var/tmp \
  --tokens 64 --profile-tokens 8 --json $R/profile_dsv4.json > $R/profile_dsv4.txt 2>&1
log "profile rc $?"
cd ../..
snap
gen() {  # tag model budget [env...]
  local tag=$1 m=$2 b=$3; shift 3
  env "$@" timeout 150 python3 -m sparkd.engine.cli generate $m --tokens 1,2,3,4,5,6,7,8 -n 64 --device cuda \
    --unified on --budget $b --json > $R/gen_$tag.json 2> $R/gen_$tag.err
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"\|"hit_rate": [0-9.]*' $R/gen_$tag.json | tr '\n' ' ') $(grep -o 'expert cache .*' $R/gen_$tag.err | head -1)"
}
for r in 1 2; do
  gen k3_off_$r $K 2500M SPARKD_STREAM_GRAPHS=off
  gen k3_exp_$r $K 2500M SPARKD_STREAM_GRAPHS=experts
  gen dsv4_off_$r $D 1600M SPARKD_STREAM_GRAPHS=off
  gen dsv4_exp_$r $D 1600M SPARKD_STREAM_GRAPHS=experts
  snap
done
