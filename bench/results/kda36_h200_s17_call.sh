#!/usr/bin/env bash
# kda36 (session 17): kimi-k3's KDA prompt rule on the H200, loop vs chunks, in one call (carry [".whl", ".xfer/kda36"]):
#   1. the GPU tests of tests/engine/test_kimi_k3.py (the chunked rule at kimi-k3's 64 heads of 128 vs float64, a
#      tiny kimi-k3 on CUDA: auto = chunks, logits vs the loop) while the test model is made;
#   2. bench/kda_prompt_bench.py at 256 / 512 / 2048 tokens, chunks of 16 / 32 / 64 / 128, eager and as CUDA graphs;
#   3. a 4-layer kimi-k3 (3 KDA + 1 MLA, hidden 2048, 8 experts, Q8_0) prompt tok/s (prefill_bench, eager: kimi-k3
#      prompts never run as graphs), a process each: loop, auto (chunks of kda.CHUNK), chunks of 32 and 64, loop again.
# Results: $OUT/res.tgz + $OUT/log.txt; every step has a timeout; END_S bounds the whole call.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
R=/tmp/res; mkdir -p $R; M=/tmp/k3-4.gguf
T0=$(date +%s); END=${END_S:-135}; left() { echo $(( END - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a $OUT/log.txt
timeout 60 python3 -m sparkd.engine.cli make-model $M --preset kimi-k3 --quant Q8_0 --layers 4 --hidden 2048 --experts 8 \
  --top-k 4 --vocab 32000 --quiet > $R/make.log 2>&1 & MK=$!
timeout 55 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE -s tests/engine/test_kimi_k3.py > $R/gpu_tests.log 2>&1
log "gpu tests rc $? $(tail -1 $R/gpu_tests.log)"; grep -h "^FAILED\|^ERROR" $R/gpu_tests.log | tee -a $OUT/log.txt
wait $MK; log "model rc $? $(ls -la $M | awk '{print $5}')"; snap
timeout 40 python3 bench/kda_prompt_bench.py --device cuda --tokens 256,512,2048 --chunks 16,32,64,128 --graph --reps 3 \
  --json $R/kda_prompt_h200.json > $R/kda_prompt_h200.log 2>&1
log "kda bench rc $?"; cat $R/kda_prompt_h200.log | tee -a $OUT/log.txt; snap
pf() {  # tag rule chunk
  [ $(left) -gt 15 ] || { log "skip $1 (time)"; return; }
  SPARKD_KDA_PROMPT=$2 timeout $(( $(left) < 45 ? $(left) : 45 )) python3 -c "import runpy, sys
import sparkd.engine.layers.kda as k
k.CHUNK = int(sys.argv[1]); sys.argv = sys.argv[1:]; sys.path[:0] = ['bench/gpu_box', 'bench']
runpy.run_path('bench/gpu_box/prefill_bench.py', run_name='__main__')" $3 --model $M --tokens 512,2048 --variants int8 \
    --repeats 2 --profile "" --json $R/prefill_$1.json > $R/prefill_$1.log 2>&1
  log "prefill $1 rc $?: $(grep 'tok/s' $R/prefill_$1.log | tr -s ' ' | tr '\n' ';')"
}
pf loop loop 16; pf auto auto 16; pf c64 chunks 64; pf c32 chunks 32; pf loop2 loop 16
log done; snap
