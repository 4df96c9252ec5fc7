#!/usr/bin/env bash
# Session 40, call 3 (carry [".whl"]): which Triton kernels a long prompt compiles that generate's warm-up (1, 2 and
# 16 tokens) does not. A fresh TRITON_CACHE_DIR; generate with a 16-token prompt (the warm-up's set), then with an
# 8000-token prompt: the cache entries the second adds are what the timed prompt compiled.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2> /dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/tcA
Q=/var/tmp/qwen3-30b-4l-Q8_0.gguf
python3 -m sparkd.engine.cli make-model $Q --preset qwen3-30b-a3b --layers 4 --quant Q8_0 --sparse --quiet
GEN="timeout 90 python3 -m sparkd.engine.cli generate --device cuda --json --resident"
LQ=$(python3 -c "print(','.join(str(1 + i % 1000) for i in range(8000)))")
S=$(python3 -c "print(','.join(str(1 + i) for i in range(16)))")
kernels() { for d in /tmp/tcA/*/; do ls $d | grep '\.json$' | grep -v '__grp__' | sed "s|^|$(basename $d) |"; done | sort; }
(cd /tmp && $GEN $Q --tokens $S -n 2 | grep -o '"prompt_tok_s": [0-9.]*')
kernels > $OUT/after16.txt
(cd /tmp && $GEN $Q --tokens $LQ -n 2 | grep -o '"prompt_tok_s": [0-9.]*')
kernels > $OUT/after8k.txt
(cd /tmp && $GEN $Q --tokens $LQ -n 2 | grep -o '"prompt_tok_s": [0-9.]*')
echo "kernels the 8000-token prompt compiled:"; comm -13 $OUT/after16.txt $OUT/after8k.txt | tee $OUT/new.txt
for h in $(awk '{print $1}' $OUT/new.txt); do
  python3 - "$h" <<'PY'
import json, pathlib, sys
for f in pathlib.Path("/tmp/tcA", sys.argv[1]).glob("*.json"):
    if f.name.startswith("__grp__"):
        continue
    m = json.loads(f.read_text())
    print(f.name, {k: m.get(k) for k in ("num_warps", "num_stages", "constants")})
PY
done 2>&1 | tee $OUT/new_meta.txt | head -40
