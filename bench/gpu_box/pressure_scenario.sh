#!/bin/bash
# GPU box (pure cgroup v2, memory controller): sparkd's watchers against real memory pressure and
# a real OOM kill. Run from the repository root through the device tool, carrying .whl:
#   bash bench/gpu_box/pressure_scenario.sh
# Writes $OUT/pressure_scenario.log (the timeline), events.jsonl, pressure.tsv, sparkd.log, status.json.
set -u
OUT=${OUT:-/tmp/pressure-out}; mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c 'import pydantic, starlette, uvicorn' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 bench/gpu_box/pressure_scenario.py --out "$OUT" 2>&1 | tee "$OUT/pressure_scenario.log"
