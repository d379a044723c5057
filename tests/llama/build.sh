#!/usr/bin/env bash
# The llama tests' build: llama.cpp with expertd's change (scripts/llama-build, the library and
# llama-completion only) into LLAMA_OUT, and the logits driver against it. Exit 77 (skipped)
# with the reason when no llama.cpp source is found. --cuda adds ggml's CUDA backend
# (scripts/llama-build --cuda; for the GPU check's llama step, scripts/gpu-pack).
#   build.sh [--cuda] LLAMA_OUT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cuda=()
if [ "${1:-}" = --cuda ]; then cuda=(--cuda); shift; fi
out=$1
mkdir -p "$out"
rm -f "$out/SKIPPED" "$out/llama_logits"
src=${LLAMA_CPP_SRC:-$(cd "$root/.." && pwd)/shared/thirdparty/llama.cpp/llama.cpp-ggml0.23.0.tar.xz}
if [ ! -e "$src" ]; then
  echo "no llama.cpp source: neither \$LLAMA_CPP_SRC nor $src exists" | tee "$out/SKIPPED"
  echo "SKIP: $(cat "$out/SKIPPED")"
  exit 77
fi
start=$(date +%s)
"$root/scripts/llama-build" "${cuda[@]}" --src "$src" --targets "llama llama-completion" "$out"
link=()
# Without a GPU driver here, libggml-cuda's driver symbols are left to the machine that runs it.
[ ${#cuda[@]} = 0 ] || ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' || link=(-Wl,--allow-shlib-undefined)
g++ -O2 -std=c++17 -I"$out/src/include" -I"$out/src/ggml/include" "$here/llama_logits.cpp" \
  -L"$out/bin" -lllama -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$out/bin" "${link[@]}" -o "$out/llama_logits"
echo "llama.cpp with expertd's change built in $(( $(date +%s) - start )) s: $out"
