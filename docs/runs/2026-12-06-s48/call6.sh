#!/usr/bin/env bash
# Session 48, call 6 (carry [".whl"]): the early pairx down as the default (SPARKD_MOE_DOWN_EARLY=auto, the loads ahead
# from width 2048): the GPU tests (bits with and without, PDL's rule, the MoE tiles), then the resident decode of a
# 12-layer Qwen3-30B-A3B-shaped and a 6-layer 16-expert Qwen3-235B-A22B-shaped Q4_K file, off / auto interleaved.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
Q=/var/tmp/qwen3-30b-a3b-12l-Q4_K.gguf; B=/var/tmp/qwen3-235b-6l-16e-Q4_K.gguf
mk() { [ -f $1 ] || { nice -n 10 python3 -m sparkd.engine.cli make-model $1.part "${@:2}" --quiet && mv $1.part $1; }; }
(mk $Q --preset qwen3-30b-a3b --layers 12 --quant Q4_K
 mk $B --preset qwen3-235b-a22b --experts 16 --layers 6 --quant Q4_K) > $R/make.log 2>&1 &
have() { while [ ! -f $1 ] && [ $(( $(date +%s) - T0 )) -lt 400 ]; do sleep 2; done; }
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_moe_pairx_down.py \
  tests/engine/test_pdl.py tests/engine/test_moe_pairx_steps.py tests/engine/test_moe_tiled.py \
  tests/engine/test_moe_tiles.py > $R/t_early.txt 2>&1
log "tests rc $? $(tail -n 1 $R/t_early.txt)"; grep -E "^(FAILED|ERROR)|^E " $R/t_early.txt | head -20 >> $OUT/log.txt
snap
GEN="timeout 60 python3 -m sparkd.engine.cli generate --device cuda --json --resident --tokens 1,2,3,4,5,6,7,8 -n 128"
gen() {
  local tag=$1 model=$2 early=$3
  (cd /tmp && env SPARKD_MOE_DOWN_EARLY=$early $GEN $model > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$tag.json) ids $(python3 -c "import json,hashlib,sys; d=json.load(open('$R/gen_$tag.json')); print(hashlib.sha1(str(d.get('tokens', d.get('ids'))).encode()).hexdigest()[:12])" 2>&1 | tail -n 1)"
}
have $Q
gen q_warm $Q auto
for r in 1 2; do gen q_off_$r $Q off; gen q_auto_$r $Q auto; done
snap
have $B
gen b_warm $B auto
for r in 1 2; do gen b_off_$r $B off; gen b_auto_$r $B auto; done
snap
