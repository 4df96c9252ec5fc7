#!/usr/bin/env bash
# The supervisor's real-hardware checks, run on the GPU box (pure cgroup v2 with the memory
# controller, an NVIDIA GPU, no systemd) through the device tool:
#   cgroupfs enforcement and a real OOM kill reported by sparkd, the GPU guard refusing a real
#   CUDA process. Wheels the box lacks travel in .whl/ (see docs/gpu-box.md).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
echo "cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
python3 -m pytest -rA -s -p no:cacheprovider "$@" \
  tests/test_daemon_cgroupfs.py tests/placement/test_cgroupfs.py tests/guards tests/system 2>&1 | tee "$OUT/supervisor-gpu.log"
