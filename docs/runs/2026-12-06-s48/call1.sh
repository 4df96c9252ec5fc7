#!/usr/bin/env bash
# Session 48, call 1 (carry [".whl"]): session 47's last slab test on the GPU; dequantize_experts timed against a
# fill and a copy, then under ncu (why ~1 TB/s); ncu of the open goal's decode kernels (Q4_KXD 4096x1536 top-8).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
R=/tmp/res; mkdir -p $R; T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
snap() { cp $OUT/log.txt $R/; tar czf $OUT/res.tgz -C /tmp res; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
S=docs/runs/2026-12-06-s48
command -v ncu > /dev/null || export PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2> /dev/null | tail -n 1)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1; log "$(tail -n 1 $R/gpu.txt)"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/engine/test_slab_gemm.py -k outside -rA \
  > $R/t_outside.txt 2>&1
log "tests rc $? $(tail -n 1 $R/t_outside.txt)"; grep -E "^(FAILED|ERROR|PASSED)|^E " $R/t_outside.txt | head -20 >> $OUT/log.txt
timeout 90 python3 $S/deq_probe.py --launch 16/4,32/4,64/8,8/2 > $R/deq.txt 2>&1
log "deq rc $?"; grep -v Warn $R/deq.txt >> $OUT/log.txt
snap
NCU="ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats
  --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats --section SourceCounters"
timeout 120 $NCU --kernel-name regex:_dequantize_kernel --launch-count 6 python3 $S/deq_probe.py --once \
  --models qwen3,deepseek-v3,gpt-oss --experts 8 > $R/ncu_deq.txt 2>&1
log "ncu deq rc $? $(grep -c 'Duration' $R/ncu_deq.txt) kernels"; snap
timeout 150 $NCU --kernel-name regex:"_igate_up_kernel|_idown_kernel" --launch-skip 40 --launch-count 4 \
  python3 bench/moe_tiles_bench.py --types Q4_KXD --sets new --shapes 4096x1536x8 --defaults-only --no-twins \
  > $R/ncu_moe.txt 2>&1
log "ncu moe rc $? $(grep -c 'Duration' $R/ncu_moe.txt) kernels"
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per" \
  $R/ncu_deq.txt $R/ncu_moe.txt | head -120 >> $OUT/log.txt
snap
