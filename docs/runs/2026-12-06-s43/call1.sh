#!/usr/bin/env bash
# Session 43, call 1 (carry [".whl", ".cache"]; .cache/old = a28a47d's sparkd, tests, pyproject):
# 1. MXFP4's grouped GEMM at gpt-oss-20b's shape (32 experts of 2880x2880, top 4, 64-row expert tiles),
#    bench/igemm_bench.py: the engine's launch (s13) against unroll 2, pipelining stages, 168 registers a thread (3
#    programs an SM), 256-row programs on 8 warps, and the bf16 fold (way field 8, FOLD 1: q * d in float32 then
#    bf16; 2: in bf16): the block's power-of-two scale folded into bf16 values, a bf16 MMA per block, one FFMA with
#    x's scale; FOLD 3 a timing proxy (not the product: one MMA chain, x's scales left out); 4 / 5: 2 / 3 with
#    mxfp4_tiled.fblock (the fold on the lookup's words before the reshape); tf32: the float
#    GEMM (x unquantized, W dequantized exact in tf32).
# 2. Session 42's open GPU question, test_kernel_path_matches_cpu_reference[cuda-IQ2_XS-*] at this code and at
#    a28a47d, then the GPU test group session 42's call 4 did not finish (test_kernel_engine, test_fused_kernels,
#    test_nibble_tiles, test_mxfp4, test_eager_decode) in three xdist workers.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
NEW=$PWD; OLD=$PWD/.cache/old
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
IG="python3 bench/igemm_bench.py --types MXFP4T --grouped-types MXFP4T --shapes '' --grouped 2880x2880 --experts 32 --top-k 4 --tokens 2000,8000 --block-t 64"
(export PYTHONPATH=/tmp/site:$NEW; eval timeout 260 $IG --ways s13,128/64/4/2/0/0,128/64/4/1/2/0,128/64/4/1/0/0/168,\
128/64/4/2/0/0/168,256/64/8/1/0/0,128/64/4/1/0/0/0/1,128/64/4/1/0/0/0/2,128/64/4/2/0/0/0/2,64/64/4/1/0/0/0/2,\
128/64/8/1/0/0/0/2,tf32,128/64/4/1/0/0/0/3,128/64/4/1/3/0/0/3,128/64/4/1/0/0/0/4,128/64/4/1/0/0/0/5,s13 --json $R/ig.json > $R/ig.txt 2>&1); log "ig rc $?"
cat $R/ig.txt >> $OUT/log.txt
snap
tst() {  # tag tree timeout args...
  local tag=$1 tree=$2 t=$3; shift 3
  (cd $tree && PYTHONPATH=/tmp/site:$tree timeout $t python3 -m pytest -q -p no:cacheprovider -m gpu "$@" \
    > $R/t_$tag.txt 2>&1)
  log "tests $tag rc $? $(tail -n 1 $R/t_$tag.txt)"
}
tst iq2_new $NEW 120 tests/engine/test_kernel_engine.py -k "test_kernel_path_matches_cpu_reference and IQ2_XS"
tst iq2_old $OLD 120 tests/engine/test_kernel_engine.py -k "test_kernel_path_matches_cpu_reference and IQ2_XS"
snap
LEFT=$(( 585 - ($(date +%s) - T0) ))
tst group $NEW $LEFT -n 3 tests/engine/test_kernel_engine.py tests/engine/test_fused_kernels.py \
  tests/engine/test_nibble_tiles.py tests/engine/test_mxfp4.py tests/engine/test_eager_decode.py
grep -E "^(FAILED|ERROR)" $R/t_group.txt | head -20 | tee -a $OUT/log.txt
snap
