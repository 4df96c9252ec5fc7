#!/usr/bin/env bash
# Session 37, call 1 (carry [".whl", ".cache"], .cache/old = 136ed8a: session 35's last tree). What session 36 could
# not run: the F16 / BF16 families' GPU tests at their default tile (its call5.sh), and generate old tree vs new on a
# 4-layer gpt-oss-20b-shaped F16 file (MXFP4 experts, the rest F16: the old tree holds those as f32) and the 5-layer
# DeepSeek V4 Flash Q4_K (window rows: should be no slower), 8- and 2000-token prompts. Results: $OUT/res.tgz, log.txt.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res1; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res1; }
NEW=$PWD; OLD=$PWD/.cache/old
export PYTHONPATH=/tmp/site:$NEW
G=/var/tmp/gpt-oss-20b-4l-F16.gguf
D=/var/tmp/deepseek-v4-5l-16e-Q4_K.gguf
mk() { [ -f $1 ] || python3 -m sparkd.engine.cli make-model "$@" --quiet; }
(mk $G --preset gpt-oss-20b --layers 4 --quant F16 --tensor-type _exps=MXFP4
 mk $D --preset deepseek-v4-flash --experts 16 --layers 5 --quant Q4_K) > $R/make.log 2>&1 & MK=$!
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_kernels.py \
  tests/engine/test_kernel_engine.py tests/engine/streaming/test_vram_cache.py \
  -k "F16 or half or 16_bit or embedding or trunk" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
log "tests: $(tail -n 2 $R/tests.txt | tr '\n' ' ')"
wait $MK
log "models rc $?: $(ls -la /var/tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
snap
gen() {  # tag tree model [args...]; from /tmp: `python3 -m` puts the working directory first on sys.path
  local tag=$1 tree=$2 m=$3; shift 3
  (cd /tmp && PYTHONPATH=/tmp/site:$tree timeout 100 python3 -c "import sparkd; print(sparkd.__file__)" > $R/tree_$tag.txt;
   PYTHONPATH=/tmp/site:$tree timeout 100 python3 -m sparkd.engine.cli generate $m --device cuda --json \
    "$@" > $R/gen_$tag.json 2> $R/gen_$tag.err)
  log "$tag rc $? $(grep -o '"prompt_tok_s": [0-9.]*\|"decode_tok_s": [0-9.]*\|"decode_step": "[a-z-]*"' $R/gen_$tag.json | tr '\n' ' ')"
}
LT=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(2000)))")
gen oss_new $NEW $G --resident --tokens 1,2,3,4,5,6,7,8 -n 128
gen oss_old $OLD $G --resident --tokens 1,2,3,4,5,6,7,8 -n 128
gen v4_new $NEW $D --resident --tokens 1,2,3,4,5,6,7,8 -n 128
gen v4_old $OLD $D --resident --tokens 1,2,3,4,5,6,7,8 -n 128
snap
gen oss_new_long $NEW $G --resident --tokens $LT -n 64 --ctx 4096
gen oss_old_long $OLD $G --resident --tokens $LT -n 64 --ctx 4096
gen v4_new_long $NEW $D --resident --tokens $LT -n 64 --ctx 4096
gen v4_old_long $OLD $D --resident --tokens $LT -n 64 --ctx 4096
gen oss_new_2 $NEW $G --resident --tokens 1,2,3,4,5,6,7,8 -n 128
gen oss_old_2 $OLD $G --resident --tokens 1,2,3,4,5,6,7,8 -n 128
snap
