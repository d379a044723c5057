#!/usr/bin/env bash
# A sticky CUDA error while serving (the simulator's EXPERTD_CUDASIM_FAIL_AFTER_COPIES): the
# daemon must report the failed call (expression, file:line, error name), turn NOT_SERVING,
# leave with exit status 3 for its service manager to restart it — within seconds, with a
# client in the middle of acquiring — and not abort.
#   daemon_sticky_error.sh EXPERTD DAEMON_CUDA_CLIENT EXPERTCTL   (the cudasim builds)
set -euo pipefail
expertd=$1 client=$2 ctl=$3
source "$(dirname "$0")/../support/daemon_test.sh"
cat > "$work/expertd.toml" <<TOML
[device]
kind = "cuda"
cuda_devices = [0]
slot_memory = "2MiB"
TOML
# 200 copies: the demo's start-up and some grants go through, then the context fails.
EXPERTD_CUDASIM_FAIL_AFTER_COPIES=200 \
  "$expertd" --demo --config "$work/expertd.toml" --socket "$sock" > "$work/daemon.log" 2>&1 &
daemon=$!; pids+=($daemon)
"$client" wait "$addr" 120 || fail "the daemon never served"
# The client fails once the daemon stops answering; its status does not matter here.
"$client" run "$addr" "$XDG_CACHE_HOME/expertd/demo/model.gguf" 400 1 0 > "$work/client.log" 2>&1 &
pids+=($!)
rc=0
for _ in $(seq 1 300); do
  kill -0 $daemon 2>/dev/null || break
  sleep 0.1
done
kill -0 $daemon 2>/dev/null && fail "the daemon still runs 30 s after the sticky error"
wait $daemon || rc=$?
grep -E 'critical|error' "$work/daemon.log" | cut -c1-400 | head -5
[ $rc = 3 ] || fail "daemon exit status $rc, expected 3"
grep -q 'device cuda:0 failed: .*cudaErrorIllegalAddress' "$work/daemon.log" \
  || fail "no log line naming the device and the CUDA error"
grep -qE 'cuda[A-Za-z]+\(.*\) failed at src/[a-z_/]+\.(cpp|h):[0-9]+' "$work/daemon.log" \
  || fail "the error does not name the failed call and its file:line"
grep -q 'injected sticky cudaErrorIllegalAddress' "$work/daemon.log" \
  || fail "the simulator did not inject the error (the test proves nothing)"
echo "PASS"
