#!/bin/bash
# sparkd's watchers against real memory pressure (memory.high throttling) and a real OOM kill, on a
# pure cgroup v2 host with the memory controller (the GPU box); elsewhere a smoke run that says why.
# From the repository root (the GPU box: through the device tool, carrying .whl):
#   bash bench/gpu_box/pressure_scenario.sh
# Writes $OUT/pressure_scenario.log (the timeline), events.jsonl, pressure.tsv, sparkd.log, hog.log, status.json.
set -u
OUT=${OUT:-/tmp/pressure-out}; mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c 'import pydantic, starlette, uvicorn' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
timeout "${SCENARIO_TIMEOUT:-220}" "$PY" bench/gpu_box/pressure_scenario.py --out "$OUT" "$@" 2>&1 | tee "$OUT/pressure_scenario.log"
exit "${PIPESTATUS[0]}"
