#!/usr/bin/env bash
# Session 8, diag16, second (short) call: the first call's bits comparison stopped at the Q8_0 MoE (row_sums
# had a return inside a constexpr if, which triton 3.6 compiles past: fixed); main's bits at the defaults vs
# this branch's again, and the GEMV split tests (Q8_0 among them: row sums with A3 0).
set -u
export PYTHONUNBUFFERED=1
ROOT=$(cd ../.. && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
( PYTHONPATH=/tmp/site:$ROOT:$ROOT/bench timeout 40 python3 bench/diag16_bits.py save /tmp/main_bits.pt \
  && PYTHONPATH=/tmp/site:$PWD:$PWD/bench timeout 30 python3 bench/diag16_bits.py compare /tmp/main_bits.pt ) > $OUT/bits2.log 2>&1 &
PYTHONPATH=/tmp/site:$PWD:$PWD/bench:$PWD/tests/engine timeout 45 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE \
  tests/engine/test_gemv_split.py -k default_split > $OUT/t_q8.log 2>&1
wait
tail -2 $OUT/t_q8.log
cat $OUT/bits2.log | tail -12
