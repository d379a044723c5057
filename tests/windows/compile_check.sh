#!/usr/bin/env bash
# The Windows side of the platform seam keeps compiling: every *_win32.cpp, and the core files
# that reach the platform only through the seam (util/file.cpp, pack/), compiled with the
# mingw-w64 cross compiler against the headers of the Abseil release in ../shared/thirdparty
# (syntax and types only: nothing is linked or run here yet). Exit 77 (skipped) with the reason
# when the compiler or the Abseil source is missing.
#   compile_check.sh SOURCE_DIR
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
cxx=x86_64-w64-mingw32-g++-posix
absl_tar=${ABSEIL_SRC:-$(cd "$root/.." && pwd)/shared/thirdparty/abseil-cpp/abseil-cpp-20220623.1.tar.xz}
command -v $cxx > /dev/null || { echo "SKIP: $cxx is missing (scripts/setup installs it)"; exit 77; }
[ -e "$absl_tar" ] || { echo "SKIP: no Abseil source: neither \$ABSEIL_SRC nor $absl_tar exists"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xf "$absl_tar" -C "$tmp" --wildcards '*/absl/*.h' '*/absl/*.inc'
absl=$(echo "$tmp"/abseil-cpp-*)
cd "$root/src"
mapfile -t sources < <(ls util/*_win32.cpp; echo util/os_file.cpp; echo util/file.cpp; ls pack/*.cpp)
failed=0
for f in "${sources[@]}"; do
  if $cxx -std=c++20 -D_WIN32_WINNT=0x0A00 -fsyntax-only -Wall -Wextra -Werror -I. -I"$absl" "$f" \
      2> "$tmp/err"; then
    echo "ok   $f"
  else
    echo "FAIL $f"; sed 's/^/     /' "$tmp/err" | head -30; failed=1
  fi
done
[ $failed = 0 ] && echo "windows.compile: ${#sources[@]} files compile for x86_64-w64-mingw32"
exit $failed
