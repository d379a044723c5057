#!/usr/bin/env bash
# Clients whose GPU done records never complete while their process lives on: the daemon must
# not wait for them for ever nor exit. With limits.lease_ttl = 2s, a client whose kernel never
# ends (its done record stays pending) and one that destroys its own CUDA context with a record
# pending (the simulator's cudaErrorContextIsDestroyed, which the daemon's queries of that
# client's event then answer) each release a grant and stay alive; another client then reads
# random experts through the same small cache, so the daemon's copies must overwrite their
# slots. Each stuck session must be ended by the daemon (logged, counted in
# expertd_done_record_failures_total), the other client must finish with every slot verified,
# and the daemon must keep serving and exit 0 on SIGTERM.
#   daemon_stuck_client.sh EXPERTD DAEMON_CUDA_CLIENT EXPERTCTL   (the cudasim builds)
set -euo pipefail
expertd=$1 client=$2 ctl=$3
source "$(dirname "$0")/../support/daemon_test.sh"
metrics_port=$((20000 + RANDOM % 20000))
cat > "$work/expertd.toml" <<TOML
[device]
kind = "cuda"
cuda_devices = [0]
slot_memory = "2MiB"
[limits]
lease_ttl = "2s"
[metrics]
listen = "127.0.0.1:$metrics_port"
TOML
"$expertd" --demo --config "$work/expertd.toml" --socket "$sock" > "$work/daemon.log" 2>&1 &
daemon=$!; pids+=($daemon)
"$client" wait "$addr" 120 || fail "the daemon never served"
gguf=$XDG_CACHE_HOME/expertd/demo/model.gguf

for mode in pending destroyed; do
  echo "== a client whose done record stays $mode"
  "$client" stuck "$addr" $mode > "$work/stuck-$mode.log" 2>&1 &
  stuck=$!; pids+=($stuck)
  for _ in $(seq 1 300); do grep -q STUCK "$work/stuck-$mode.log" && break; sleep 0.1; done
  grep -q STUCK "$work/stuck-$mode.log" || { cat "$work/stuck-$mode.log"; fail "no stuck client"; }
  # Reads through the same 2 MiB cache: its copies overwrite the stuck client's slots.
  timeout 120 "$client" run "$addr" "$gguf" 60 7 0 > "$work/run-$mode.log" 2>&1 \
    || { tail -5 "$work/run-$mode.log"; fail "another client was not served ($mode)"; }
  grep RESULT "$work/run-$mode.log" | head -2
  rc=0
  wait $stuck || rc=$?
  cat "$work/stuck-$mode.log" | grep -E 'ENDED|FAIL' | cut -c1-300
  [ $rc = 0 ] || fail "the stuck client's session was not ended by the daemon ($mode, exit $rc)"
  kill -0 $daemon 2>/dev/null || fail "the daemon exited ($mode)"
done
grep -E 'ending it' "$work/daemon.log" | cut -c1-300
grep -q 'still pending' "$work/daemon.log" || fail "no log line for the pending record"
grep -q "client's context failed" "$work/daemon.log" || fail "no log line for the destroyed context"
failures=$(python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
  "http://127.0.0.1:$metrics_port/metrics" | awk '$1 == "expertd_done_record_failures_total" {print $2}')
echo "RESULT done_record_failures_total=${failures:-?}"
[ "${failures:-0}" = 2 ] || fail "expertd_done_record_failures_total is ${failures:-unset}, expected 2"
kill -TERM $daemon
rc=0
wait $daemon || rc=$?
[ $rc = 0 ] || fail "daemon exit $rc after SIGTERM"
echo "PASS"
