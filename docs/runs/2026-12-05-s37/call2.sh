#!/usr/bin/env bash
# Session 37, call 2 (carry [".whl", ".cache"], .cache/old = 136ed8a: session 35's last tree). Call 1 was refused
# (no machine); this is it plus the sliding-window rings (5878db7): their GPU tests and the attention kernels' (the
# RING constexpr must leave the rows-per-position paths as they were), the F16 / BF16 tests at their default tile,
# then generate old tree vs new on a 4-layer gpt-oss-20b-shaped F16 file (the old tree: F16 weights as f32, a row
# per position in the 12 windowed layers... of 4 here: 2) and the 5-layer DeepSeek V4 Flash Q4_K, 8- and 2000-token
# prompts, and an 8000-token gpt-oss prompt (the rings at 4x their rows); the plan's attention workspace (session 37's
# count of the keys widened per head) against CUDA's peak allocation. Results: $OUT/res.tgz, $OUT/log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res2; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res2; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
D=/var/tmp/deepseek-v4-5l-16e-Q4_K.gguf
mk() { [ -f $1 ] || python3 -m sparkd.engine.cli make-model "$@" --quiet; }
(mk $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4
 mk $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K) > $R/make.log 2>&1 & MK=$!
t() {  # tag timeout files/args...
  local tag=$1 lim=$2; shift 2
  timeout $lim python3 -m pytest -q -p no:cacheprovider -m gpu "$@" > $R/tests_$tag.txt 2>&1
  echo "rc $?" >> $R/tests_$tag.txt
  log "tests $tag: $(tail -n 2 $R/tests_$tag.txt | tr '\n' ' ')"
}
t ring 150 tests/engine/test_swa_ring.py
t mem 120 tests/engine/test_attention_memory.py
t attn 150 tests/engine/test_rope_attention.py tests/engine/test_decode_kernels.py tests/engine/test_fused_kernels.py
t half 120 tests/engine/test_kernels.py tests/engine/test_kernel_engine.py tests/engine/streaming/test_vram_cache.py \
  -k "F16 or half or 16_bit or embedding or trunk"
snap
wait $MK
log "models rc $?: $(ls -la /var/tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
gen() {  # tag tree model [args...]; from /tmp: `python3 -m` puts the working directory first on sys.path
  local tag=$1 tree=$2 m=$3; shift 3
  (cd /tmp && PYTHONPATH=/tmp/site:$tree timeout 90 python3 -m sparkd.engine.cli generate $m --device cuda --json \
    "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*\|"cache_bytes": [0-9]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ')"
}
S=1,2,3,4,5,6,7,8
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
L8=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
gen oss_new $NEW $G --resident --tokens $S -n 128
gen oss_old $OLD $G --resident --tokens $S -n 128
gen v4_new $NEW $D --resident --tokens $S -n 128
gen v4_old $OLD $D --resident --tokens $S -n 128
snap
gen oss_new_2k $NEW $G --resident --tokens $LT -n 64
gen oss_old_2k $OLD $G --resident --tokens $LT -n 64
gen v4_new_2k $NEW $D --resident --tokens $LT -n 64
gen v4_old_2k $OLD $D --resident --tokens $LT -n 64
snap
gen oss_new_8k $NEW $G --resident --tokens $L8 -n 64
gen oss_old_8k $OLD $G --resident --tokens $L8 -n 64
gen oss_new_b $NEW $G --resident --tokens $S -n 128
gen oss_old_b $OLD $G --resident --tokens $S -n 128
snap
