#!/usr/bin/env bash
# Session 15, branch step26, second call (H200, carry [".whl", ".xfer/step26"], run from .xfer/step26): decode
# attention split over key ranges (SPARKD_DECODE_ATTENTION_SPLIT=auto, the new default) against one walk a head
# (off). GPU tests of the kernel (with the models being made), the off path's bits against main's kernel
# (../../, the tree the run sent), then the decode A/B of the 12-layer Q8_0 model only (the device budget) in one process (decode_kernels.py --split-ab:
# off/auto interleaved, 2 rounds, the first 128 tokens as generate -n 128, then 512 more). Results: $OUT/res.tgz.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
W=/var/tmp/sparkd-cuda; mkdir -p $W
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
mk() { nice -n 10 timeout 100 python3 -m sparkd.engine.cli make-model $1 --preset qwen3-30b-a3b --quant $2 --quiet --layers 12; }
mk $W/q3-12-Q8_0.gguf Q8_0 > $R/make.log 2>&1 & M=$!
E=tests/engine
timeout 70 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $E/test_fused_kernels.py -k "decode_attention or (static_step and qwen3moe)" \
  > $R/gpu_tests_1.log 2>&1 & P1=$!
timeout 70 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $E/test_eager_decode.py -k "qwen3moe or switch_off" \
  > $R/gpu_tests_2.log 2>&1 & P2=$!
SPARKD_DECODE_ATTENTION_SPLIT=off timeout 60 python3 - > $R/bits_vs_main.log 2>&1 <<'PY'
import importlib.util, torch
from sparkd.engine.kernels.decode_attention import decode_attention as new
spec = importlib.util.spec_from_file_location("main_da", "../../sparkd/engine/kernels/decode_attention.py")
main = importlib.util.module_from_spec(spec); spec.loader.exec_module(main)
torch.manual_seed(0)
for H, Hkv, S, pos, win, sinks in [(32, 4, 256, 135, 0, False), (32, 4, 1024, 900, 0, True), (8, 2, 2048, 2047, 100, False)]:
    q, k, v = (torch.randn(*s, device="cuda") for s in ((1, H, 128), (S, Hkv, 128), (S, Hkv, 128)))
    sk = torch.randn(H, device="cuda") if sinks else None
    p = torch.tensor([pos], device="cuda")
    print(H, Hkv, S, pos, "off == main's bits:", torch.equal(new(q, k, v, p, 0.1, win, sk), main.decode_attention(q, k, v, p, 0.1, win, sk)))
PY
log "bits rc $? $(tr '\n' ' ' < $R/bits_vs_main.log | tail -c 300)"
wait $P1; log "tests 1 rc $? $(tail -1 $R/gpu_tests_1.log)"
wait $P2; log "tests 2 rc $? $(tail -1 $R/gpu_tests_2.log)"
grep -h "^FAILED\|^ERROR" $R/gpu_tests_*.log | tee -a $OUT/log.txt
wait $M; log "models $(ls -la $W/*.gguf | awk '{print $5}' | tr '\n' ' ')"; snap
timeout 60 python3 bench/gpu_box/decode_kernels.py $W/q3-12-Q8_0.gguf --split-ab 2 --tokens 128 \
  --long-tokens 512 --ctx 1024 --json $R/split_ab.json > $R/split_ab.log 2>&1
log "split a/b rc $?"; grep -v -i warn $R/split_ab.log | tail -12; snap
