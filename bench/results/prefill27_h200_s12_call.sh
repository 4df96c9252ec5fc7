#!/usr/bin/env bash
# Session 12 prefill27's call (H200, cold box; carry [".whl", ".xfer/prefill27"]): the K-quants' min term of pairx's
# integer GEMMs (matmul.IgemmTile.mins) as int32 multiply-adds (s12), float32 FMAs or two int8 tl.dots a group.
# Phase 1 (parallel, ~40 s): the 12-layer Q4_K model made, the GPU tests of the touched files, igemm_bench's kernels
# compiled (--repeats 1). Phase 2 (tests stopped with SIGSTOP): igemm_bench timed alone (grouped MoE gate/up and
# down at 512 and 2048 tokens, the dense qkv/o projections), then prefill_bench 512/2048, ways interleaved, profiled
# at 512. Phase 3: the tests go on until END_S (122 s) after the start.
# (As run: the engine had IgemmTile.mins "float" then, and the prefill_bench ways mfloat / mdot on both pairx GEMMs;
# after the call float left the engine and mdot is the dense GEMM's dots only: docs/performance.md, prefill27.)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); left() { echo $(( ${END_S:-122} - $(date +%s) + T0 )); }; log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $R/log.txt; }
snap() { tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
M=$W/q3-12-Q4_K.gguf
( [ -f $M ] || { nice -n 10 timeout 60 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K \
  --quiet --layers 12 && mv $M.part $M; } ) > $R/make.log 2>&1 & MK=$!
E=tests/engine
P=()
run_t() {  # a test group in its own process group (setsid: $! is the group, for SIGSTOP / SIGCONT)
  local i=$1; shift
  setsid nice -n 5 timeout $(( $(left) - 4 )) python3 -m pytest -q -p no:cacheprovider -m gpu -rfE "$@" > $R/gpu_tests_$i.log 2>&1 &
  P+=($!)
}
run_t 1 $E/test_kernels.py -k igemm_steps
run_t 2 $E/test_kernels.py -k int8_gemm_is
run_t 3 $E/test_kernels.py -k "(igemm or int8 or grouped) and not igemm_steps and not int8_gemm_is"
run_t 4 $E/test_int_kernels.py
GW="s12,64/32/4/1/2/2/168/float,64/32/4/1/2/2/168/dot,64/32/4/1/2/2/0/dot,64/32/4/1/2/2/128/dot"
DW="s12,64/32/4/1/2/0/168/float,64/32/4/1/2/0/168/dot"
GB="python3 igemm_bench.py --types Q4T --shapes '' --grouped-types Q4T"
DB="python3 igemm_bench.py --types Q4T --grouped ''"
C=()
for g in 768x2048 2048x768; do
  (cd bench && eval timeout 50 $GB --grouped $g --tokens 512 --ways $GW --repeats 1 > $R/warm_$g.log 2>&1) & C+=($!)
done
for d in 5120x2048 2048x4096; do
  (cd bench && eval timeout 50 $DB --shapes $d --tokens 512 --ways $DW --repeats 1 > $R/warm_$d.log 2>&1) & C+=($!)
done
for p in "${C[@]}"; do wait $p; done; log "igemm compiled: $(grep -h -c 'bits' $R/warm*.log | tr '\n' ' ')"
wait $MK; log "model rc $? $(ls -la $M 2>&1 | awk '{print $5}')"
for p in "${P[@]}"; do kill -STOP -- -$p 2>/dev/null; done; log "tests stopped"
(cd bench && eval timeout 25 $GB --grouped 768x2048,2048x768 --tokens 512,2048 --ways $GW --repeats 20 \
  --json $R/igemm_grouped.json > $R/igemm_grouped.log 2>&1); log "igemm grouped rc $?"
(cd bench && eval timeout 12 $DB --shapes 5120x2048,2048x4096 --tokens 512,2048 --ways $DW --repeats 20 \
  --json $R/igemm_dense.json > $R/igemm_dense.log 2>&1); log "igemm dense rc $?"; snap
(cd bench/gpu_box && timeout $(( $(left) - 22 )) python3 prefill_bench.py --model $M --tokens 512,2048 --repeats 3 \
  --variants int8,mfloat,mdot,int8,mfloat,mdot --profile int8,mfloat,mdot --json $R/prefill_Q4_K.json) > $R/prefill_Q4_K.log 2>&1
log "prefill Q4_K rc $?: $(grep -E ' (512|2048) tokens|GPU kernels' $R/prefill_Q4_K.log | tr -s ' ' | tr '\n' ';')"; snap
for p in "${P[@]}"; do kill -CONT -- -$p 2>/dev/null; done; log "tests continued"
for i in "${!P[@]}"; do wait ${P[$i]}; log "tests group $((i+1)) rc $? $(tail -1 $R/gpu_tests_$((i+1)).log)"; done
grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $R/log.txt
log done; snap
