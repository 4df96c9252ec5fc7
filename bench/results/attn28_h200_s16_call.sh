#!/usr/bin/env bash
# Session 16, branch attn28, one call (H200, cold box; carry [".whl", ".xfer/attn28"]; run from .xfer/attn28):
# (1) the decode attention's fold at short positions: SPARKD_DECODE_ATTENTION_SPLIT auto (new: ranges without keys
#     return at once, one range stores its result, the fold a block of ranges at a time) vs serial (session 15's fold)
#     vs off (one walk a head): the kernel alone by position (decode_attention_bench.py), bits against main's kernel
#     (../../, the tree the run sent), the GPU tests, the 12-layer Q4_K decode in one process interleaved
#     (decode_kernels.py --split-ab 2: positions 8-136, then to 648) and a process each (generate, 8-136 and after a
#     512-token prompt) as long as the budget lasts;
# (2) continue vs the whole prompt at (cached, total) pairs (prompt_cache_bench.py: graph = continue, off = whole).
# Results: $OUT/res.tgz + $OUT/log.txt. Every step has a timeout; END_S bounds the whole call.
# As run (commit 02f38e2, cuda_graphs.CONTINUE_MIN_SHARE 1/4 then, 1/6 after): 130.4 s on the box, 212 s of device
# budget with the cold start (bench/results/attn28_h200_s16_call_log.txt); the budget guard skipped the generate runs
# after "short off" (serial, the 512-token prompt, the second repeats).
set -u
timeout 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); END=${END_S:-138}; left() { echo $(( END - $(date +%s) + T0 )); }
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }  # survives a timeout
M=$W/q3-12-Q4_K.gguf
(nice -n 10 timeout 90 python3 -m sparkd.engine.cli make-model $M.part --preset qwen3-30b-a3b --quant Q4_K --quiet \
  --layers 12 && mv $M.part $M) > $R/make.log 2>&1 & MK=$!
timeout 40 python3 bench/gpu_box/decode_attention_bench.py --positions 8,40,63,72,100,136,200,300,520,1000,2000 \
  --json $R/attn_kernel.json > $R/attn_kernel.log 2>&1
log "kernel bench rc $?"; grep -v -i warn $R/attn_kernel.log | tee -a $OUT/log.txt
E=tests/engine
timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $E/test_fused_kernels.py -k "decode_attention or (static_step and qwen3moe)" \
  > $R/gpu_tests_1.log 2>&1 & P1=$!
timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $E/test_eager_decode.py $E/test_pdl.py -k "qwen3moe or switch_off or decode_bits" \
  > $R/gpu_tests_2.log 2>&1 & P2=$!
timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $E/test_prompt_cache.py \
  > $R/gpu_tests_3.log 2>&1 & P3=$!
timeout 50 python3 - > $R/bits_vs_main.log 2>&1 <<'PY'
import importlib.util, torch
from sparkd.engine.kernels import decode_attention as new
spec = importlib.util.spec_from_file_location("main_da", "../../sparkd/engine/kernels/decode_attention.py")
main = importlib.util.module_from_spec(spec); spec.loader.exec_module(main)
torch.manual_seed(0)
for H, Hkv, S, pos, win, sinks in [(32, 4, 256, 135, 0, False), (32, 4, 256, 40, 0, True), (32, 4, 1024, 900, 0, True),
                                   (8, 2, 2048, 2047, 100, False)]:
    q, k, v = (torch.randn(*s, device="cuda") for s in ((1, H, 128), (S, Hkv, 128), (S, Hkv, 128)))
    sk = torch.randn(H, device="cuda") if sinks else None
    p = torch.tensor([pos], device="cuda")
    got = {}
    for rule in ("auto", "serial", "off"):
        new.SPLIT_RULE, main.SPLIT_RULE = rule, "auto" if rule == "serial" else rule  # main's auto: the serial fold
        got[rule] = new.decode_attention(q, k, v, p, 0.1, win, sk)
        if rule != "auto":
            got["main_" + rule] = main.decode_attention(q, k, v, p, 0.1, win, sk)
    print(H, Hkv, S, pos, win, sinks, "serial == main's auto:", torch.equal(got["serial"], got["main_serial"]),
          "off == main's off:", torch.equal(got["off"], got["main_off"]), "auto == serial:", torch.equal(got["auto"], got["serial"]),
          "auto vs serial max rel:", float(((got["auto"] - got["serial"]).abs().max() / got["serial"].abs().max())))
PY
log "bits rc $?"; cat $R/bits_vs_main.log | grep -v -i warn | tee -a $OUT/log.txt
for i in 1 2 3; do wait $(eval echo \$P$i); log "tests $i rc $? $(tail -1 $R/gpu_tests_$i.log)"; done
grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $OUT/log.txt; snap
wait $MK; log "model rc $? $(ls -la $M 2>&1 | awk '{print $5}')"
[ -f $M ] || { log "no model"; snap; exit 1; }
timeout $(( $(left) > 40 ? 35 : $(left) - 3 )) python3 bench/gpu_box/decode_kernels.py $M --split-ab 2 --rules off,serial,auto \
  --tokens 128 --long-tokens 512 --ctx 1024 --json $R/split_ab.json > $R/split_ab.log 2>&1
log "split a/b rc $?"; grep -v -i warn $R/split_ab.log | tail -5 | tee -a $OUT/log.txt; snap
# continue (graph) vs the whole prompt (off) at (cached, total): 128/256/384/512/1024 of 2048, 128/256 of 1024, 1024 of 4096
[ $(left) -gt 25 ] && { timeout $(( $(left) > 45 ? 40 : $(left) - 3 )) python3 bench/gpu_box/prompt_cache_bench.py --model $M \
  --turn1 112:16:1920,240:16:1792,368:16:1664,496:16:1536,1008:16:1024,112:16:896,240:16:768,1008:16:3072 \
  --reps 2 --no-gap --ctx 8192 --json $R/prompt_cache.json > $R/prompt_cache.log 2>&1
  log "prompt cache rc $?"; grep -E "^turn|^prompt graphs" $R/prompt_cache.log | cut -c1-260 | tee -a $OUT/log.txt; snap; }
# a process each, as long as the budget lasts: generate at positions 8-136, then after a 512-token prompt
gen() {  # rule tag prompt
  [ $(left) -gt 16 ] || return
  SPARKD_DECODE_ATTENTION_SPLIT=$1 timeout 15 python3 -m sparkd.engine.cli generate $M --tokens $3 \
    -n 128 --device cuda --resident --cuda-graphs on --json > $R/gen_$2_$1.json 2> $R/gen_$2_$1.err
  log "generate $2 $1 rc $?: $(grep -o '"decode_tok_s": [0-9.]*' $R/gen_$2_$1.json)"
}
P512=$(seq -s, 1 512)
gen auto short 1,2,3,4,5,6,7,8; gen off short 1,2,3,4,5,6,7,8; gen serial short 1,2,3,4,5,6,7,8
gen auto d512 $P512; gen serial d512 $P512; gen auto short2 1,2,3,4,5,6,7,8; gen off short2 1,2,3,4,5,6,7,8
log done; snap
