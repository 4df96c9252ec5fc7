#!/usr/bin/env bash
# Session 10, branch router10 (H200, cold box, carry [".whl", ".xfer/router10"]): the router top-k
# with NaN / +-inf logits. First the kernel before the fix (_old_router_topk.py, e2c02d8's file,
# put next to this tree for the call only:
# git show e2c02d8:sparkd/engine/kernels/router_topk.py > _old_router_topk.py) and after it on the same inputs; then the GPU router
# tests (test_fused_kernels.py and test_moe_decode_fusion.py, -k "router or gate_topk"), both at once.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
timeout 50 python3 - > $OUT/probe.txt 2>&1 <<'PY' &
import importlib.util, torch
from sparkd.engine.kernels import router_topk as new
spec = importlib.util.spec_from_file_location("old_router_topk", "_old_router_topk.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
nan = float("nan")
for E in (6, 160):
    for k in (4,):
        for gating in ("softmax", "sigmoid"):
            for case in ("one_nan", "all_nan", "last_nan"):
                x = torch.randn(2, E)
                if case == "one_nan": x[:, 1] = nan
                elif case == "all_nan": x[:] = nan
                else: x[:, E - 1] = nan
                x = x.cuda()
                want = torch.topk(x if gating != "softmax" else torch.softmax(x, -1), k).indices.cpu().tolist()
                row = []
                for name, m in (("old", old), ("new", new)):
                    _, ids = m.router_topk(x, k, gating, False, 0.0, 6e-5)
                    torch.cuda.synchronize(); ids = ids.cpu()
                    row.append(f"{name} {ids[0].tolist()} oob={int((ids >= E).sum())} dup={int(len(set(ids[0].tolist())) < k)}")
                print(f"E={E} k={k} {gating} {case}: torch {want[0]} | " + " | ".join(row))
PY
P=$!
timeout 55 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_fused_kernels.py \
  tests/engine/test_moe_decode_fusion.py -k "router or gate_topk" 2>&1 | tee $OUT/gpu_tests.txt | tail -15
echo "tests rc ${PIPESTATUS[0]}"
wait $P; echo "probe rc $?"; cat $OUT/probe.txt
