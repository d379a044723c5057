#!/usr/bin/env bash
# expertctl's service tools against the real demo daemon: health (grpc_health_probe exit codes),
# bench from three concurrent sessions verifying every granted slot against the model file,
# stats (live sessions during the bench, on their lanes, consistent model counters after it), the
# same over the stream (--transport stream), a bench against
# the wrong model file (every slot a mismatch, exit 1), and SIGTERM (exit 0, then health 2).
#   expertctl_bench.sh EXPERTD EXPERTCTL TRACE
set -euo pipefail
expertd=$1 ctl=$2 trace=$3
py=/usr/bin/python3
work=$(mktemp -d)
daemon=
cleanup() {
  [ -n "$daemon" ] && kill -9 "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; tail -40 "$work/daemon.log" 2>/dev/null; exit 1; }

export XDG_CACHE_HOME=$work/cache
sock=$work/run/expertd.sock
addr=unix://$sock

echo "== health before the daemon runs: connection failure (2)"
rc=0; "$ctl" health --addr "$addr" || rc=$?
[ $rc -eq 2 ] || fail "health without a daemon: exit $rc, want 2"

echo "== start the demo daemon; health 0 once it serves"
"$expertd" --demo --socket "$sock" > "$work/daemon.log" 2>&1 &
daemon=$!
up=0
for _ in $(seq 1 120); do
  if "$ctl" health --addr "$addr" > /dev/null 2>&1; then up=1; break; fi
  kill -0 "$daemon" 2>/dev/null || fail "the daemon exited during start-up"
  sleep 0.5
done
[ $up -eq 1 ] || fail "health never returned 0"
[ "$("$ctl" health --addr "$addr" --service demo)" = serving ] || fail "health --service demo"
rc=0; "$ctl" health --addr "$addr" --service no-such-model 2> /dev/null || rc=$?
[ $rc -eq 3 ] || fail "health of an unknown service: exit $rc, want 3 (RPC failure)"
gguf=$XDG_CACHE_HOME/expertd/demo/model.gguf

echo "== bench: 3 sessions over $(basename "$trace"), every slot verified; stats while it runs"
"$ctl" bench --addr "$addr" --trace "$trace" --gguf "$gguf" --sessions 3 --json \
  > "$work/bench.json" 2> "$work/bench.err" &
bench=$!
polls=0
while kill -0 $bench 2>/dev/null; do
  "$ctl" stats --addr "$addr" --json > "$work/live.$polls.json" || fail "stats during the bench"
  polls=$((polls + 1))
  sleep 0.2
done
rc=0; wait $bench || rc=$?
cat "$work/bench.err"
cat "$work/bench.json"
[ $rc -eq 0 ] || fail "bench exit $rc"
$py - "$work/bench.json" <<'PY' || fail "bench results"
import json, sys
b = json.load(open(sys.argv[1]))
keys = {"accesses", "hit_rate", "verified", "mismatches", "errors", "acquire_p50_us",
        "acquire_p99_us", "throughput_bytes_per_s", "sessions", "seconds", "bytes_granted",
        "transport", "cycle_p50_us", "cycle_p99_us"}
assert set(b) == keys, sorted(set(b) ^ keys)
# Over the Unix socket the default transport is the session's shared-memory lane.
assert b["transport"] == "lane", b
assert 0 < b["acquire_p50_us"] <= b["cycle_p50_us"] <= b["cycle_p99_us"], b
assert b["sessions"] == 3 and b["errors"] == 0 and b["mismatches"] == 0, b
assert b["verified"] > 0 and b["verified"] == b["accesses"], b
assert 0 <= b["hit_rate"] <= 1 and b["bytes_granted"] > 0 and b["throughput_bytes_per_s"] > 0, b
assert 0 < b["acquire_p50_us"] <= b["acquire_p99_us"], b
print(f"bench: hit rate {b['hit_rate']:.3f}, {b['throughput_bytes_per_s'] / 2**20:.0f} MiB/s, "
      f"acquire p50 {b['acquire_p50_us']:.0f} us p99 {b['acquire_p99_us']:.0f} us")
PY

echo "== stats: the bench's sessions while live, consistent model counters after"
"$ctl" stats --addr "$addr" --json > "$work/stats.json" || fail "stats"
$py - "$work/bench.json" "$work/stats.json" "$work"/live.*.json <<'PY' || fail "stats"
import json, sys
bench = json.load(open(sys.argv[1]))
after = json.load(open(sys.argv[2]))
(m,) = [m for m in after["models"] if m["model"] == "demo"]
assert m["accesses"] == bench["accesses"], (m["accesses"], bench["accesses"])
assert m["hits"] + m["joins"] + m["misses"] == m["accesses"], m
assert m["hits"] + m["misses"] > 0 and m["pack_bytes_read"].get("P", 0) > 0, m
assert after["sessions"] == 0 and m["sessions"] == [], "sessions outlived the bench"
seen = 0
for path in sys.argv[3:]:
    for lm in json.load(open(path))["models"]:
        for s in lm["sessions"]:
            if not s["client_name"].startswith("expertctl-bench/") or s["acquires"] == 0:
                continue
            seen += 1
            granted = s["hits"] + s["misses"]
            assert 0 < granted <= 2 * s["acquires"] and s["errors"] == 0, s
            assert s["leases_held"] <= 1, s
            # Every acquire and release of a lane session is a lane request.
            assert s["transport"] == "lane" and s["lane"]["requests"] >= s["acquires"], s
            assert s["lane"]["responses"] >= s["acquires"] - 1, s  # one acquire may be in flight
assert seen > 0, "no live bench session seen in any stats poll"
print(f"stats: {seen} live session snapshots; after: accesses {m['accesses']}, hits {m['hits']}, "
      f"joins {m['joins']}, misses {m['misses']}")
PY
"$ctl" stats --addr "$addr" | grep -q "^model demo" || fail "stats text"

echo "== bench --transport stream: the same checks over the gRPC stream"
"$ctl" bench --addr "$addr" --trace "$trace" --gguf "$gguf" --limit 300 --transport stream --json \
  > "$work/stream.json" 2> /dev/null || fail "bench --transport stream"
$py -c 'import json,sys; b=json.load(open(sys.argv[1])); assert b["transport"] == "stream" and b["errors"] == 0 and b["verified"] == b["accesses"] > 0, b' \
  "$work/stream.json" || fail "stream bench counts"

echo "== bench against a different model file: every slot a mismatch, exit 1"
"$ctl" synth --preset mixtral-tiny --out "$work/other" --seed 8 > /dev/null 2>&1
rc=0
"$ctl" bench --addr "$addr" --trace "$trace" --gguf "$work/other/model.gguf" --limit 50 --json \
  > "$work/wrong.json" 2> /dev/null || rc=$?
[ $rc -eq 1 ] || fail "bench against the wrong model: exit $rc, want 1"
$py -c 'import json,sys; b=json.load(open(sys.argv[1])); assert b["verified"] == 0 and b["mismatches"] == b["accesses"] > 0, b' \
  "$work/wrong.json" || fail "wrong-model bench counts"

echo "== SIGTERM: the daemon exits 0, then health reports a connection failure (2)"
kill -TERM "$daemon"
rc=0; wait "$daemon" || rc=$?
daemon=
[ $rc -eq 0 ] || fail "daemon exit $rc after SIGTERM"
rc=0; "$ctl" health --addr "$addr" 2> /dev/null || rc=$?
[ $rc -eq 2 ] || fail "health after SIGTERM: exit $rc, want 2"
echo "PASS"
