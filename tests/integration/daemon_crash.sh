#!/usr/bin/env bash
# The daemon killed with SIGKILL while two clients, one on the C++ API and one on the C API,
# each hold a lease and keep acquiring (tests/integration/lane_client.cpp, modes survive and
# survive-c):
#  1. the client's next call fails with UNAVAILABLE within 1 s of the kill, and the lease it
#     still holds stays readable with the right bytes (no SIGBUS);
#  2. the killed daemon left no name in /dev/shm (its objects are memfds); the next daemon's
#     start removes names a dead process left (an older daemon that used shm_open; here a name
#     made for an exited pid) but keeps names of live processes, and logs what it removed;
#  3. the same client processes open a session on the new daemon and verify a lease; once they
#     close their sessions, none of their shared-memory mappings or descriptors is left.
#   daemon_crash.sh EXPERTD LANE_CLIENT
set -euo pipefail
expertd=$1 lane_client=$2
work=$(mktemp -d)
daemon= client= cclient=
live_name=/dev/shm/expertd-$$-test-live
cleanup() {
  [ -n "$client" ] && kill -9 "$client" 2> /dev/null || true
  [ -n "$cclient" ] && kill -9 "$cclient" 2> /dev/null || true
  [ -n "$daemon" ] && kill -9 "$daemon" 2> /dev/null || true
  rm -f "$live_name"
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; tail -20 "$work/daemon.log" 2> /dev/null; exit 1; }

export XDG_CACHE_HOME=$work/cache
sock=$work/run/expertd.sock
addr=unix://$sock
starts=0
start_daemon() {  # each start logs to its own file; daemon.log is the latest
  starts=$((starts + 1))
  "$expertd" --demo --socket "$sock" > "$work/daemon.$starts.log" 2>&1 &
  daemon=$!
  ln -sf "daemon.$starts.log" "$work/daemon.log"
  for _ in $(seq 1 240); do
    grep -q "serving demo" "$work/daemon.$starts.log" && return 0
    kill -0 "$daemon" 2> /dev/null || fail "the daemon exited during start-up"
    sleep 0.25
  done
  fail "the daemon did not serve within 60 s"
}

start_daemon
first=$daemon
gguf=$XDG_CACHE_HOME/expertd/demo/model.gguf
"$lane_client" survive "$addr" "$gguf" > "$work/client.txt" 2>&1 &
client=$!
"$lane_client" survive-c "$addr" > "$work/cclient.txt" 2>&1 &
cclient=$!
for f in client cclient; do
  for _ in $(seq 1 200); do grep -q holding "$work/$f.txt" && break; sleep 0.05; done
  grep -q holding "$work/$f.txt" || { cat "$work/$f.txt"; fail "the $f did not start"; }
done
sleep 0.5

echo "== 1. kill -9 of the daemon while the client acquires"
killed_at=$(date +%s.%N)
kill -9 "$first"
wait "$first" 2> /dev/null || true
daemon=
for f in client cclient; do
  for _ in $(seq 1 100); do grep -q "^failed" "$work/$f.txt" && break; sleep 0.05; done
  line=$(grep "^failed" "$work/$f.txt") || { cat "$work/$f.txt"; fail "no call of the $f failed"; }
  echo "$f: $line"
  failed_at=$(echo "$line" | awk '{print $2}')
  delay=$(awk -v a="$killed_at" -v b="$failed_at" 'BEGIN {printf "%.3f", b - a}')
  echo "the $f's first call failed $delay s after the kill"
  awk -v d="$delay" 'BEGIN {exit !(d <= 1.0)}' || fail "the $f failed $delay s after the kill (limit 1 s)"
  echo "$line" | grep -q "^failed [0-9.]* 14 " || fail "not UNAVAILABLE (14): $line"
done
kill -0 "$client" 2> /dev/null || { cat "$work/client.txt"; fail "the client died (the held lease was not readable?)"; }
kill -0 "$cclient" 2> /dev/null || { cat "$work/cclient.txt"; fail "the C client died"; }

echo "== 2. what the killed daemon left, and the next start"
# Its arenas, fence tables, done words and lanes are memfds: no name to leave behind.
left=$(ls /dev/shm | grep -cE "^expertd-(lane-)?$first-" || true)
echo "names of the killed daemon (pid $first) in /dev/shm: $left"
[ "$left" -eq 0 ] || fail "the killed daemon left $left names in /dev/shm"
# Names an older daemon (one that used shm_open) would have left are still reclaimed at start.
# A name of another process that no longer exists, and one of a live process (this shell).
sh -c 'exit 0' &
gone=$!
wait $gone
: > "/dev/shm/expertd-lane-$gone-7"
: > "$live_name"
start_daemon
[ ! -e "/dev/shm/expertd-lane-$gone-7" ] || fail "the name of exited pid $gone is still there"
[ -e "$live_name" ] || fail "the name of a live process was removed"
# At least that one (other dead processes may have left names too), with its pid named.
removed=$(grep -o "removed [0-9]* shared-memory object(s).*" "$work/daemon.log") ||
  fail "the daemon did not log the names it removed"
echo "$removed"
n=$(echo "$removed" | awk '{print $2}')
[ "$n" -ge 1 ] || fail "the daemon logged $n names removed, at least 1 expected"
echo "$removed" | grep -qw "$gone" || fail "the log does not name pid $gone"

echo "== 3. the same client processes on the new daemon; nothing of the old ones left"
rc=0; wait "$client" || rc=$?
client=
[ $rc -eq 0 ] || { cat "$work/client.txt"; fail "client exit $rc"; }
grep -q recovered "$work/client.txt" || fail "the client did not recover"
rc=0; wait "$cclient" || rc=$?
cclient=
[ $rc -eq 0 ] || { cat "$work/cclient.txt"; fail "C client exit $rc"; }
grep -q recovered "$work/cclient.txt" || fail "the C client did not recover"
kill -TERM "$daemon"
wait "$daemon" || fail "daemon exit $? after SIGTERM"
daemon=
echo "PASS"
