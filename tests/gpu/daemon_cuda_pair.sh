#!/usr/bin/env bash
# The daemon-level GPU test: the real expertd serving its demo model from the CUDA device, and
# two client processes (daemon_cuda_client) whose CUDA kernels read granted slots in place
# through IPC and check them against the model file, releasing leases while their kernels still
# run (on the staging path the second waits for the copies on the CPU, WaitReadyOnHost, as
# llama.cpp's change does; every other acquire repeats the previous one, a client-side hit whose
# pins must outlast its kernels); then acquire-to-ready latency for a miss and a hit. Twice: with packs read into pinned
# staging (readers.method = pread), and with the direct path (mmap packs registered with
# cudaHostRegister — read-only, or through a private writable mapping where the GPU cannot
# register read-only memory — and copied from the registration). Exit 77 (skip) without a GPU.
# expertctl bench (a real Mixtral trace, 2 sessions, every slot copied back and checked against
# the GGUF) runs against the staging-path daemon as well.
#   daemon_cuda_pair.sh EXPERTD DAEMON_CUDA_CLIENT EXPERTCTL [ITERATIONS]
set -euo pipefail
expertd=$1 client=$2 ctl=$3 iterations=${4:-400}
root=$(cd "$(dirname "$0")/../.." && pwd)
"$client" probe || exit $?
FAIL_LOG_LINES=40
source "$(dirname "$0")/../support/daemon_test.sh"
# A small cache (2 MiB: about 14 of the demo's 256 bundles of ~140 KiB), so a slot released a
# moment ago is soon overwritten while the kernels that read it (each sleeping DELAY on the GPU
# first) may still run: the daemon's copy must wait for their done records.
# start METHOD: starts the daemon reading packs with METHOD (pread: staging; mmap: the direct
# path, copies from the registered pack mapping).
start() {
  cat > "$work/expertd.toml" <<TOML
[device]
kind = "cuda"
cuda_devices = [0]
slot_memory = "2MiB"
direct_copies = true
[readers]
method = "$1"
[limits]
lease_ttl = "30s"
drain_timeout = "10s"
TOML
  rm -f "$sock"
  "$expertd" --demo --config "$work/expertd.toml" --socket "$sock" > "$work/daemon.log" 2>&1 &
  daemon=$!; pids+=($daemon)
  for _ in $(seq 1 600); do [ -S "$sock" ] && break; sleep 0.1; done
  [ -S "$sock" ] || fail "no socket after 60 s"
  "$client" wait "$addr" 120 || fail "the daemon never served"
  grep -q 'serving from device cuda:0' "$work/daemon.log" || fail "the daemon is not on cuda:0"
  grep -E 'device|pack' "$work/daemon.log" | cut -c1-200 | head -6
}
stop() {
  kill -TERM $daemon
  local drc=0
  wait $daemon || drc=$?
  [ $drc = 0 ] || fail "daemon exit $drc after SIGTERM"
  grep -E 'stopped' "$work/daemon.log" | tail -1
}
gguf=$XDG_CACHE_HOME/expertd/demo/model.gguf
delay=1000000  # ns each checksum kernel sleeps before reading its slot
evictions() {
  "$ctl" stats --addr "$addr" --json | grep -o '"evictions": *[0-9]*' | head -1 | sed 's/.*: *//'
}

echo "== staging path: two client processes, kernels reading slots in place, released while running"
start pread
# Every other acquire repeats the previous one: a hit served in the client's own process
# (client-side hits), released while its kernels run; its pins must hold the slots until they end.
"$client" run "$addr" "$gguf" "$iterations" 1 $delay repeat > "$work/a.log" 2>&1 & a=$!
"$client" run "$addr" "$gguf" "$iterations" 2 $delay host-wait repeat > "$work/b.log" 2>&1 & b=$!
rc=0
wait $a || rc=1
wait $b || rc=1
cat "$work/a.log" "$work/b.log"
[ $rc = 0 ] || fail "a client saw wrong bytes or an error"
for log in a b; do
  n=$(grep -o 'local=[0-9]*' "$work/$log.log" | sed 's/local=//')
  grep -q 'client_hits=yes' "$work/$log.log" || fail "client $log: the session has no client-side hits"
  [ "${n:-0}" -gt 0 ] || fail "client $log: no lease was served in its process"
done
hits=$("$ctl" stats --addr "$addr" --json | grep -o '"client_hits": *[0-9]*' | head -1 | sed 's/.*: *//')
echo "client-side hits the daemon counted: ${hits:-0}"
[ "${hits:-0}" -gt 0 ] || fail "the daemon counted no client-side hits"
ev=$(evictions)
echo "evictions so far: $ev"
[ "${ev:-0}" -gt 100 ] || fail "only ${ev:-0} evictions: the cache did not turn over"

echo "== a client killed while its kernels (2 s each) still read released slots"
"$client" run "$addr" "$gguf" 8 7 2000000000 > "$work/killed.log" 2>&1 & k=$!
sleep 1.5
kill -9 $k 2>/dev/null || true
wait $k 2>/dev/null || true
timeout 120 "$client" run "$addr" "$gguf" 200 8 $delay > "$work/after.log" 2>&1 \
  || { cat "$work/after.log"; fail "the daemon did not serve on after a client died mid-kernel"; }
cat "$work/after.log"

echo "== acquire-to-ready latency (staging path)"
"$client" latency "$addr" 400 3 || fail "latency pass"

echo "== expertctl bench on the CUDA daemon: a real trace, 2 sessions, slots copied back and checked"
trace=$root/tests/data/traces/mixtral-8x7b/gsm8k_2_routing.jsonl
"$ctl" bench --addr "$addr" --trace "$trace" --gguf "$gguf" --sessions 2 --json \
  > "$work/bench.json" || fail "expertctl bench"
# (grep, not Python: the GPU machine's python3 is not needed for this)
field() { grep -o "\"$1\": *[0-9.e+-]*" "$work/bench.json" | head -1 | sed 's/.*: *//'; }
echo "RESULT expertctl-bench-cuda verified=$(field verified) mismatches=$(field mismatches)" \
  "hit_rate=$(field hit_rate) throughput_bytes_per_s=$(field throughput_bytes_per_s)"
[ "$(field mismatches)" = 0 ] && [ "$(field verified)" -gt 0 ] || fail "expertctl bench mismatches"
stop

echo "== direct path (readers.method = mmap, pack mapping registered)"
start mmap
# The path the device announced (its "serving from device" line) decides what is right: read-only
# registration of the pack's mapping, registration of a private writable mapping (no read-only
# support: x86 hosts with discrete GPUs), or staging (no registration at all).
device_line=$(grep 'serving from device cuda:0' "$work/daemon.log")
if [[ $device_line == *"registered read-only (cudaHostRegisterReadOnly)"* ]]; then
  expect='direct \([0-9]+ bytes registered read-only\)'
elif [[ $device_line == *"private writable mappings"* ]]; then
  expect='direct \([0-9]+ bytes registered through a private writable mapping'
else
  expect='staging \(device cuda:0 does not register host memory\)'
fi
echo "expected pack path: $expect"
grep -qE "pack [^ ]+: $expect" "$work/daemon.log" \
  || fail "the pack did not take the path the device announced"
"$client" run "$addr" "$gguf" "$iterations" 4 $delay > "$work/c.log" 2>&1 & c=$!
"$client" run "$addr" "$gguf" "$iterations" 5 $delay > "$work/d.log" 2>&1 & e=$!
rc=0
wait $c || rc=1
wait $e || rc=1
cat "$work/c.log" "$work/d.log"
[ $rc = 0 ] || fail "a client saw wrong bytes or an error (direct path)"
direct=$("$ctl" stats --addr "$addr" --json | grep -o '"bytes_direct": *[0-9]*' | head -1 |
  sed 's/.*: *//')
echo "bytes copied straight from the registered mapping: ${direct:-0}"
if [[ $expect == direct* ]]; then
  [ "${direct:-0}" -gt 0 ] || fail "no bytes took the direct path"
else
  [ "${direct:-0}" = 0 ] || fail "bytes took a direct path the device does not have"
fi
echo "== acquire-to-ready latency (direct path)"
"$client" latency "$addr" 400 6 || fail "latency pass (direct path)"
stop
echo "PASS"
