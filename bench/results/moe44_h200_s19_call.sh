#!/usr/bin/env bash
# Session 19, moe44 (H200, carry [".whl", ".xfer/B"], run from .xfer/B): the Q8_0 MoE down as moe_pipe's
# software-pipelined persistent kernel (moe_tiles.Kernels.pipe_down: N programs an SM, the next step's weight words in
# flight during this step's dots), against the engine's grid down in the same process (the gate/up: moe42's pipe).
#   1. moe_tiles_bench.py at 4096x1536 top-8 Q8_0: the engine's layer (and again), --floor, and the layer and the down
#      with the down's pipe at the engine's down tile 2/1/2/e/2 (16 / 32 / 8 an SM), steps of 3 groups, one range
#      (no fold) and 4-row tiles.
#   2. step 1's rows again in a process of their own (the noise of two runs).
#   3. the MoE GPU tests (test_moe_pipe.py's down bits test at the three widths among them) and the pipe's registers.
#   4. 2048x768 and 7168x2048 top-8 Q8_0: the engine's layer against the down's pipe.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
R=/tmp/res; mkdir -p $R
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/ 2>/dev/null; tar czf $OUT/res.tgz -C /tmp res 2>/dev/null; }
B="env PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/moe_tiles_bench.py --defaults-only --sets new --types Q8_0 --no-twins"
PD=16,32,8,16@2/1/3/e/2,8@2/1/3/e/2,8@2/1/2/e/1,16@2/1/2/e/1,16@4/1/2/e/2
timeout 85 $B --compile-workers 8 --floor --shapes 4096x1536x8 --variants again --pipe-down $PD --json $R/pipe.json \
  > $R/pipe.log 2>&1
log "4096 bench rc $?"; snap
timeout 40 $B --shapes 4096x1536x8 --variants again --pipe-down $PD --json $R/again.json > $R/again.log 2>&1
log "4096 again rc $?"; snap
E=tests/engine
G=("$E/test_moe_pipe.py $E/test_pdl.py"
   "$E/test_moe_tiles.py $E/test_moe_decode_fusion.py")
P=(); i=0; for g in "${G[@]}"; do i=$((i+1))
  (eval timeout 45 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $R/tests_$i.log 2>&1; \
   echo "rc $?" >> $R/tests_$i.log) & P+=($!)
done
timeout 40 python3 - > $R/regs.log 2>&1 <<'PY'
import torch
from gguf import GGMLQuantizationType as T
from sparkd.engine.kernels import moe, moe_pipe, moe_tiles
from sparkd.engine.kernels.matmul import GemvConfig
import sys; sys.path.insert(0, "tests/engine")
from test_kernels import arena_table
p = moe.prepare(arena_table(T.Q8_0, T.Q8_0, 4096, 1536, 8, "cuda")[0], "cuda")
x, w = torch.randn(4096, device="cuda"), torch.rand(8, device="cuda")
gu = GemvConfig(block_n=2, unroll=4, elementwise=True, fuse_quant=True)
h = moe._gate_up(p, x, w, False, "silu", gu, None, "regs", None, moe_tiles.Kernels())
y = torch.empty(4096, device="cuda")
for u, s, bn in ((2, 2, 2), (3, 2, 2), (2, 1, 2), (2, 2, 4)):
    moe._down(p, h, w, y, GemvConfig(block_n=bn, unroll=u, elementwise=True, split=s), None, None,
              moe_tiles.Kernels(pipe_down=16))
torch.cuda.synchronize()
for dev, cache in moe_pipe.down_kernel.device_caches.items():
    for key, k in cache[0].items():
        print("down_kernel", k.metadata.num_warps, "regs", k.n_regs, "spills", k.n_spills, str(key)[:300])
PY
log "regs rc $?"; wait "${P[@]}"
for i in $(seq 1 ${#G[@]}); do log "tests $i (${G[$((i-1))]}): $(tail -2 $R/tests_$i.log | tr '\n' ' ')"; done
grep -h "^FAILED\|^ERROR" $R/tests_*.log | head -20 | tee -a $OUT/log.txt
cat $R/regs.log | cut -c1-200 | tee -a $OUT/log.txt
timeout 35 $B --shapes 2048x768x8,7168x2048x8 --variants again --pipe-down 16@2/1/3/e/2,16@2/1/1/e/2,16,8 \
  --json $R/widths.json > $R/widths.log 2>&1
log "widths bench rc $?"; snap
log done; snap
