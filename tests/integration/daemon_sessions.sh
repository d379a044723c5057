#!/usr/bin/env bash
# The daemon as a real process with real client processes: health transitions, concurrent
# verified acquires, a client killed with leases, a client killed with client-side pins, every
# bad-request class, SIGTERM under load,
# a peer uid that is not allowed, and TCP authentication.
#   daemon_sessions.sh EXPERTD SESSION_CLIENT RAW_RPC
set -euo pipefail
expertd=$1 client=$2 raw=$3
work=$(mktemp -d)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$work"/daemon*.log 2>/dev/null | tail -40; exit 1; }

export XDG_CACHE_HOME=$work/cache
sock=$work/run/expertd.sock
addr=unix://$sock
mport=$(( 20000 + RANDOM % 20000 ))
cat > "$work/expertd.toml" <<TOML
[metrics]
listen = "127.0.0.1:$mport"
[device]
# A quarter of the demo model's experts: some are never resident at once.
slot_memory = "8MiB"  # 65 of the 256 bundles (31 MiB)
[limits]
max_leases_per_session = 8
lease_ttl = "30s"
drain_timeout = "5s"
TOML

wait_health() {  # wait_health WANT SECONDS
  for _ in $(seq 1 $(( $2 * 10 ))); do
    [ "$("$raw" "$addr" health 2>/dev/null || true)" = "$1" ] && return 0
    sleep 0.1
  done
  return 1
}

echo "== start: health NOT_SERVING while starting, SERVING once the model is loaded"
"$expertd" --demo --config "$work/expertd.toml" --socket "$sock" --hold-before-serving 3s \
  > "$work/daemon.log" 2>&1 &
daemon=$!; pids+=($daemon)
wait_health NOT_SERVING 60 || fail "health never reported NOT_SERVING during start-up"
wait_health SERVING 60 || fail "health never reported SERVING"
[ "$("$raw" "$addr" health demo)" = SERVING ] || fail "model service not SERVING"
"$raw" "$addr" health no-such-model | grep -q NOT_FOUND || fail "unknown health service"
[ "$(stat -c %a "$sock")" = 660 ] || fail "socket mode $(stat -c %a "$sock")"
[ "$(stat -c %a "$work/run")" = 750 ] || fail "socket directory mode $(stat -c %a "$work/run")"
gguf=$XDG_CACHE_HOME/expertd/demo/model.gguf

echo "== three client processes acquire concurrently and verify every byte"
for seed in 1 2 3; do
  "$client" verify "$addr" "$gguf" 4 $seed > "$work/verify$seed.log" 2>&1 &
  vp[$seed]=$!
done
for seed in 1 2 3; do
  wait ${vp[$seed]} || { cat "$work/verify$seed.log"; fail "verify client $seed"; }
  cat "$work/verify$seed.log"
done

echo "== Prometheus metrics count what the clients did"
# Nothing but these three clients acquired so far: the counters must equal their own counts.
/usr/bin/python3 - "$mport" "$work"/verify[123].log <<'PY' || fail "metrics"
import re, sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
acquired = slotted = local = 0
for path in sys.argv[2:]:
    m = re.search(r"(\d+) acquires, (\d+) slots, \d+ projections verified, (\d+) acquires served in the client",
                  open(path).read())
    assert m, f"no counts in {path}"
    acquired += int(m.group(1)); slotted += int(m.group(2)); local += int(m.group(3))
def value(name):
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    assert m, f"missing {name}"
    return float(m.group(1))
hits = value('expertd_slot_hits_total{model="demo",device="host"}')
misses = value('expertd_slot_misses_total{model="demo",device="host"}')
joins = value('expertd_slot_joins_total{model="demo",device="host"}')
count = value('expertd_acquire_stall_seconds_count{model="demo",device="host"}')
inf = value('expertd_acquire_stall_seconds_bucket{model="demo",device="host",le="+Inf"}')
read = value('expertd_pack_read_bytes_total{model="demo",device="host",pack="P"}')
copied = value('expertd_copied_bytes_total{model="demo",device="host"}')
direct = value('expertd_direct_bytes_total{model="demo",device="host"}')
client_hits = value('expertd_client_hits_total{model="demo",device="host"}')
assert 0 <= direct <= copied and copied > 0, (direct, copied)
assert value("expertd_up") == 1
assert hits + misses + joins == slotted, (hits, misses, joins, slotted)
# Acquires of resident experts are served in the client and reported as hits afterwards; only
# the others reach the daemon's stall histogram.
assert local > 0, "no acquire was served in the client (client-side hits)"
assert client_hits == local * slotted / acquired, (client_hits, local, slotted, acquired)
assert count == acquired - local and inf == count, (count, inf, acquired, local)
assert misses > 0 and read > 0, (misses, read)
print(f"metrics: {acquired} acquires of {slotted} slots by the clients ({local} served in the "
      f"clients, {client_hits:.0f} client hits); hits {hits:.0f} "
      f"misses {misses:.0f} joins {joins:.0f}; stall histogram count {count:.0f}; "
      f"pack bytes {read:.0f}")
PY

echo "== kill -9 a client holding leases: they are reclaimed, others unaffected"
"$client" hold "$addr" 6 > "$work/hold.log" 2>&1 &
holder=$!; pids+=($holder)
for _ in $(seq 1 100); do grep -q holding "$work/hold.log" && break; sleep 0.1; done
grep -q "holding 6" "$work/hold.log" || fail "holder did not get its leases"
"$client" leases "$addr" | tee "$work/leases.txt"
grep -q "leases 6" "$work/leases.txt" || fail "stats do not show the 6 held leases"
"$client" verify "$addr" "$gguf" 2 9 > "$work/verify9.log" 2>&1 &
other=$!
kill -9 $holder
reclaimed=no
for _ in $(seq 1 50); do
  if "$client" leases "$addr" | grep -q "leases 0"; then reclaimed=yes; break; fi
  sleep 0.1
done
[ $reclaimed = yes ] || fail "leases of the killed client were not reclaimed"
wait $other || { cat "$work/verify9.log"; fail "a client running beside the killed one failed"; }
echo "reclaimed; the other client verified: $(tail -1 "$work/verify9.log")"

echo "== kill -9 a client holding client-side pins: its bundles stay resident while it lives, not after"
sessions_before=$("$client" leases "$addr" | awk '{print $2}')
"$client" pin "$addr" > "$work/pin.log" 2>&1 &
pinner=$!; pids+=($pinner)
for _ in $(seq 1 100); do grep -q pinning "$work/pin.log" && break; sleep 0.1; done
grep -q "pinning 4" "$work/pin.log" || { cat "$work/pin.log"; fail "the pinner did not pin"; }
"$client" sweep "$addr" > "$work/sweep1.log" 2>&1 || { cat "$work/sweep1.log"; fail "sweep"; }
grep -q "pinned bundles resident 4 of 4" "$work/sweep1.log" ||
  { cat "$work/sweep1.log"; fail "pinned bundles were evicted while pinned"; }
kill -9 $pinner
gone=no
for _ in $(seq 1 50); do
  if [ "$("$client" leases "$addr" | awk '{print $2}')" = "$sessions_before" ]; then
    gone=yes; break
  fi
  sleep 0.1
done
[ $gone = yes ] || fail "the killed pinner's session did not end"
"$client" sweep "$addr" > "$work/sweep2.log" 2>&1 || { cat "$work/sweep2.log"; fail "sweep"; }
grep -q "pinned bundles resident 0 of 4" "$work/sweep2.log" ||
  { cat "$work/sweep2.log"; fail "a dead client's pins still kept bundles resident"; }
echo "pinned: $(cat "$work/sweep1.log"); after the kill: $(cat "$work/sweep2.log")"

echo "== bad requests get the right codes and change nothing"
"$client" bad "$addr" || fail "bad-request checks"

echo "== SIGTERM under load: drain, then exit 0"
for i in 1 2; do
  "$client" load "$addr" "$gguf" > "$work/load$i.log" 2>&1 &
  lp[$i]=$!
done
# Both clients must be acquiring (20 verified acquires each) before the signal.
for i in 1 2; do
  for _ in $(seq 1 600); do grep -q "loaded 20" "$work/load$i.log" && break; sleep 0.1; done
  grep -q "loaded 20" "$work/load$i.log" || { cat "$work/load$i.log"; fail "load client $i never got going"; }
done
kill -TERM $daemon
set +e
wait $daemon; rc=$?
set -e
[ $rc -eq 0 ] || fail "daemon exit code $rc after SIGTERM"
for i in 1 2; do
  wait ${lp[$i]} || { cat "$work/load$i.log"; fail "load client $i"; }
  tail -1 "$work/load$i.log"
done
grep -q "draining" "$work/daemon.log" || fail "no drain in the log"
[ ! -e "$sock" ] || fail "socket file left behind"

echo "== a peer uid that is not allowed is refused (SO_PEERCRED)"
cat > "$work/open.toml" <<TOML
[listen]
socket_mode = "0666"
directory_mode = "0755"
TOML
# A fresh folder: the mode applies when the daemon creates it.
sock=$work/run2/expertd.sock
addr=unix://$sock
"$expertd" --demo --config "$work/open.toml" --socket "$sock" > "$work/daemon2.log" 2>&1 &
daemon=$!; pids+=($daemon)
wait_health SERVING 60 || fail "second daemon did not start"
[ "$(stat -c %a "$sock")" = 666 ] || fail "socket mode $(stat -c %a "$sock") (want 666 from the config)"
if setpriv --reuid=65534 --regid=65534 --clear-groups "$client" leases "$addr" \
     > "$work/nobody.log" 2>&1; then
  fail "uid 65534 was served"
fi
grep -q "refused pid .* uid 65534" "$work/daemon2.log" || fail "no refusal logged for uid 65534"
echo "uid 65534 refused: $(grep -m1 'refused pid' "$work/daemon2.log" | cut -c25-)"
kill -TERM $daemon; wait $daemon

echo "== TCP: a token is required; sessions never go over TCP"
port=$(( 20000 + RANDOM % 20000 ))
printf 'expertd-test-token-0123456789\n' > "$work/token"
cat > "$work/tcp.toml" <<TOML
[listen]
tcp = "127.0.0.1:$port"
tcp_token_file = "$work/token"
TOML
"$expertd" --demo --config "$work/tcp.toml" --socket "$sock" > "$work/daemon3.log" 2>&1 &
daemon=$!; pids+=($daemon)
wait_health SERVING 60 || fail "TCP daemon did not start"
"$raw" "127.0.0.1:$port" list | tee /dev/stderr | grep -q UNAUTHENTICATED || fail "TCP without token served"
"$raw" "127.0.0.1:$port" list --token wrong-token-value-xx | grep -q UNAUTHENTICATED || fail "wrong token served"
"$raw" "127.0.0.1:$port" list --token expertd-test-token-0123456789 | grep -q '^OK' || fail "token refused"
"$raw" "127.0.0.1:$port" open demo --token expertd-test-token-0123456789 | tee /dev/stderr \
  | grep -q FAILED_PRECONDITION || fail "a session was opened over TCP"
kill -TERM $daemon; wait $daemon
cat > "$work/tcp-open.toml" <<TOML
[listen]
tcp = "0.0.0.0:$port"
TOML
if "$expertd" --demo --config "$work/tcp-open.toml" --socket "$sock" > "$work/daemon4.log" 2>&1; then
  fail "an unauthenticated non-loopback TCP listener started"
fi
cat "$work/daemon4.log"
grep -q "listen.tcp" "$work/daemon4.log" || fail "the refusal does not name the key"
echo "PASS"
