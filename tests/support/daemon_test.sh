# Sourced (bash) by the shell tests that run a daemon and client processes: a work folder,
# removed at exit after every process in `pids` was killed; fail MESSAGE (prints it and the end
# of $work/daemon.log, exits 1); XDG_CACHE_HOME inside the work folder (where the demo model is
# made); `sock` and `addr`, the daemon's socket. Before sourcing, FAIL_LOG_LINES (default 30)
# says how much of the log fail prints.
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "--- daemon log"
  tail -"${FAIL_LOG_LINES:-30}" "$work/daemon.log" 2>/dev/null
  exit 1
}
export XDG_CACHE_HOME=$work/cache
sock=$work/run/expertd.sock
addr=unix://$sock
