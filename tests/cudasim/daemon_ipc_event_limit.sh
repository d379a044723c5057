#!/usr/bin/env bash
# The CUDA driver's bound on IPC events per process (4096 on an H200 with CUDA 13; the simulator
# refuses the 4097th too): every slot takes two for its fence table and one more per session.
# With device.cuda_ipc_event_limit set from the demo's slot count N:
#   3N - 1: not one session fits: the daemon must refuse to start, saying why (exit 1);
#   4N:     room for two sessions: the start-up log says so, two sessions are served with every
#           slot verified, a third at once is refused with RESOURCE_EXHAUSTED naming the IPC
#           events, and the daemon serves on and exits 0.
#   daemon_ipc_event_limit.sh EXPERTD EXPERTCTL TRACE   (the cudasim builds)
set -euo pipefail
expertd=$1 ctl=$2 trace=$3
FAIL_LOG_LINES=20
source "$(dirname "$0")/../support/daemon_test.sh"
daemon=""
gguf=$XDG_CACHE_HOME/expertd/demo/model.gguf
config() {  # LIMIT
  cat > "$work/expertd.toml" <<TOML
[device]
kind = "cuda"
cuda_devices = [0]
slot_memory = "2MiB"
cuda_ipc_event_limit = $1
TOML
}
# Runs the daemon until it serves (0) or exits (its status).
start() {
  rm -f "$sock"
  "$expertd" --demo --config "$work/expertd.toml" --socket "$sock" > "$work/daemon.log" 2>&1 &
  daemon=$!; pids+=($daemon)
  for _ in $(seq 1 600); do
    grep -q "serving demo" "$work/daemon.log" && return 0
    if ! kill -0 $daemon 2>/dev/null; then
      local rc=0
      wait $daemon || rc=$?
      daemon=""
      return $rc
    fi
    sleep 0.1
  done
  fail "the daemon neither served nor exited within 60 s"
}

echo "== the demo's slot count, with room to spare"
config 4096
start || fail "the daemon did not start with the default bound"
n=$(sed -n 's/.* \([0-9][0-9]*\) slots in 1 class.*/\1/p' "$work/daemon.log" | head -1)
[ -n "$n" ] && [ "$n" -gt 0 ] || fail "no slot count in the log"
kill -TERM $daemon; wait $daemon || fail "daemon exit status after SIGTERM"; daemon=""
echo "demo: $n slots"

echo "== bound 3N-1 = $((3 * n - 1)): not one session fits"
config $((3 * n - 1))
rc=0
start || rc=$?
[ $rc != 0 ] || fail "the daemon served a model for which not one session fits"
grep -q "not one session would fit" "$work/daemon.log" || fail "no reason in the log (exit $rc)"
grep -m1 "not one session would fit" "$work/daemon.log" | cut -c1-260

echo "== bound 4N = $((4 * n)): room for two sessions"
config $((4 * n))
start || fail "the daemon did not start with room for two sessions"
grep -q "room for 2 session(s) at once" "$work/daemon.log" || fail "no room line in the log"
grep -m1 "room for 2" "$work/daemon.log" | cut -c1-260
"$ctl" bench --addr "$addr" --trace "$trace" --gguf "$gguf" --sessions 2 --limit 200 --json \
  > "$work/two.txt" 2>&1 || { cat "$work/two.txt"; fail "two sessions were not served"; }
grep -E 'mismatches|verified' "$work/two.txt" | head -3
grep -qE 'mismatches[^0-9]*0\b' "$work/two.txt" || fail "mismatches with two sessions"
rc=0
"$ctl" bench --addr "$addr" --trace "$trace" --gguf "$gguf" --sessions 3 --limit 200 --json \
  > "$work/three.txt" 2>&1 || rc=$?
[ $rc != 0 ] || fail "three sessions at once were served with room for two"
grep -q "IPC events" "$work/three.txt" || { cat "$work/three.txt"; fail "the refusal does not name the IPC events"; }
grep -m1 "IPC events" "$work/three.txt" | cut -c1-260
"$ctl" health --addr "$addr" || fail "the daemon does not serve after the refusal"
kill -TERM $daemon
rc=0
wait $daemon || rc=$?
daemon=""
[ $rc = 0 ] || fail "daemon exit $rc after SIGTERM"
echo "daemon_ipc_event_limit: OK"
