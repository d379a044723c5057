#!/usr/bin/env bash
# Runs a Windows executable under Debian's wine64 in the given wine prefix: the cross-build's
# CMAKE_CROSSCOMPILING_EMULATOR, so gtest discovery and ctest run the tests' .exe files.
# wine's own diagnostics are silenced (WINEDEBUG=-all); the program's exit status passes through
# and its output follows once it has exited (stdout, then stderr).
# A program that exits non-zero having printed nothing at all was not started by wine (a test
# program always prints; seen now and then when many tests start at once): it is started again,
# at most twice, with a line on stderr saying so.
#   wine-run.sh WINEPREFIX PROGRAM.exe [ARGS...]
set -uo pipefail
export WINEPREFIX=$1
shift
export WINEDEBUG=${WINEDEBUG:--all}
out=$(mktemp) && err=$(mktemp) || exit 1
trap 'rm -f "$out" "$err"' EXIT
for attempt in 1 2 3; do
  /usr/lib/wine/wine64 "$@" > "$out" 2> "$err"
  rc=$?
  if [ "$rc" = 0 ] || [ -s "$out" ] || [ -s "$err" ] || [ "$attempt" = 3 ]; then break; fi
  echo "wine-run: $(basename "$1") exited $rc with no output (wine did not start it);" \
       "starting it again" >&2
done
cat "$out"
cat "$err" >&2
exit "$rc"
