#!/usr/bin/env bash
# Download llama-cpp-python's sdist (the vendored llama.cpp that cuda_side_by_side.sh builds on the box) and trim it to
# what a CUDA build of llama-bench needs: the full sdist is 74 MB (a 38 MB git pack, vocab GGUFs, docs, bench records,
# a video), over the device call's 64 MiB limit with the wheels beside it; trimmed it is ~9 MB.
# Usage (here, from the checkout root): bash bench/gpu_box/trim_sdist.sh   -> .cache/llama_cpp_python-0.3.36.tar.gz
set -euo pipefail
VERSION=${VERSION:-0.3.36}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama_cpp_python==$VERSION"
mkdir "$tmp/src" && tar -xzf "$tmp/llama_cpp_python-$VERSION.tar.gz" -C "$tmp/src"
top=$(ls "$tmp/src"); v="$tmp/src/$top/vendor/llama.cpp"
rm -rf "$tmp/src/$top/.git" "$v/models" "$v/docs" "$v/benches" "$v/tools/ui" "$v"/tools/mtmd/*.mp4
mkdir -p .cache "$v/models"
tar -czf ".cache/llama_cpp_python-$VERSION.tar.gz" -C "$tmp/src" "$top"
ls -la ".cache/llama_cpp_python-$VERSION.tar.gz"
