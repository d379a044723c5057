#!/usr/bin/env bash
# One client cannot harm another (needs root: it runs a client as a second user with setpriv).
# The demo daemon runs as root with primary group nogroup and `listen.allowed_gids = [65534]`; a
# client runs as nobody:nogroup, i.e. another user in the allowed group:
#  1. it reads granted slots over its lane, every slot verified against the GGUF;
#  2. the arenas and fence tables map read-only but never read-write (their passed descriptors
#     are sealed, also when reopened through /proc), its done words and its lane come only as
#     descriptors passed to it, the daemon's descriptors under /proc are refused, and another
#     process is refused its descriptors (lane_client isolate);
#  3. the daemon has no name in /dev/shm at all.
#   daemon_isolation.sh EXPERTD SESSION_CLIENT LANE_CLIENT
set -euo pipefail
if [ "$(id -u)" != 0 ] || ! command -v setpriv > /dev/null; then
  echo "SKIP: needs root and setpriv to run a client as a second user"
  exit 77
fi
expertd=$1 session_client=$2 lane_client=$3
work=$(mktemp -d)
daemon=
cleanup() {
  [ -n "$daemon" ] && kill -9 "$daemon" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; tail -30 "$work/daemon.log" 2> /dev/null; exit 1; }

# The second user must reach the client binary and the demo model.
chmod 755 "$work"
cp "$lane_client" "$work/lane_client"
export XDG_CACHE_HOME=$work/cache
sock=$work/run/expertd.sock
addr=unix://$sock
cat > "$work/expertd.toml" <<TOML
[listen]
allowed_gids = [65534]
TOML
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }

setpriv --regid=65534 --clear-groups \
  "$expertd" --demo --config "$work/expertd.toml" --socket "$sock" > "$work/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 1 240); do
  if "$session_client" leases "$addr" > /dev/null 2>&1; then break; fi
  kill -0 "$daemon" 2> /dev/null || fail "the daemon exited during start-up"
  sleep 0.25
done
"$session_client" leases "$addr" > /dev/null 2>&1 || fail "the daemon did not serve within 60 s"
chmod -R a+rX "$XDG_CACHE_HOME"

echo "== 1. another user in the allowed group reads verified slots over its lane"
gguf=$XDG_CACHE_HOME/expertd/demo/model.gguf
as_nobody "$work/lane_client" grants "$addr" "$gguf" lane 200 7 > "$work/grants.txt" ||
  fail "grants as nobody"
echo "   $(wc -l < "$work/grants.txt") grants, every slot verified"

echo "== 2. what it can reach of the shared objects"
out=$(as_nobody "$work/lane_client" isolate "$addr" "$daemon") || fail "isolate: $out"
echo "   $out"

echo "== 3. the daemon's names in /dev/shm: none"
mine=$(find /dev/shm -maxdepth 1 -name "expertd*-$daemon-*" | wc -l)
echo "   $mine names of pid $daemon in /dev/shm"
[ "$mine" -eq 0 ] || { ls -l /dev/shm; fail "$mine names of the daemon in /dev/shm"; }

kill -TERM "$daemon"
wait "$daemon" || fail "daemon exit $? after SIGTERM"
daemon=
echo "PASS"
