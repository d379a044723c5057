#!/usr/bin/env bash
# Runs a Windows executable under Debian's wine64 in the given wine prefix: the cross-build's
# CMAKE_CROSSCOMPILING_EMULATOR, so gtest discovery and ctest run the tests' .exe files.
# wine's own diagnostics are silenced (WINEDEBUG=-all); the program's output and exit status
# pass through unchanged.
#   wine-run.sh WINEPREFIX PROGRAM.exe [ARGS...]
set -euo pipefail
export WINEPREFIX=$1
shift
export WINEDEBUG=${WINEDEBUG:--all}
exec /usr/lib/wine/wine64 "$@"
