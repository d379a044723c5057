#!/usr/bin/env bash
# The session request lane against the gRPC stream, measured client side with `expertctl bench`
# against the same daemon in one run (docs/performance.md, "The request lane"):
#   all-fit   the demo model with every bundle resident ([device] slot_memory = "1023MiB"), one
#             warm-up pass, then ROUNDS rounds of stream and lane alternately: acquire and
#             acquire+release (the Acquire→Grant→Release cycle) p50 / p99, and lane/stream ratios
#   4 procs   four expertctl processes at once, on the lane and then on the stream: each one's
#             p50 against one session's; then the same on the lane with --no-read (the protocol
#             alone, the slots not read)
#   quarter   the default demo pool (a quarter of the bundles fit): throughput and hit rate over
#             the lane and over the stream, alternately
# Every granted slot is verified against the model file; a benchmark, not a test: it reports,
# and fails only when a run fails or a slot mismatches.
#   bench/lane_bench.sh [--limit N] [--rounds R] [--trace T] [--bin DIR]
#   (defaults 4000, 3, humaneval_2, build/bin). CI runs the short version: --limit 300 --rounds 1.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=4000 rounds=3 trace=tests/data/traces/mixtral-8x7b/humaneval_2_routing.jsonl bin=build/bin
while [ $# -gt 0 ]; do
  case $1 in
    --limit) limit=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --trace) trace=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) echo "usage: bench/lane_bench.sh [--limit N] [--rounds R] [--trace T] [--bin DIR]" >&2
       exit 2 ;;
  esac
done
expertd=$bin/expertd ctl=$bin/expertctl
[ -x $expertd ] && [ -x $ctl ] || { echo "build first (scripts/build)" >&2; exit 2; }
work=$(mktemp -d)
daemon=
cleanup() {
  [ -n "$daemon" ] && kill -9 "$daemon" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export XDG_CACHE_HOME=$work/cache  # the daemon synthesizes the demo model there (under a second)
gguf=$XDG_CACHE_HOME/expertd/demo/model.gguf
sock=$work/expertd.sock
addr=unix://$sock

start() {  # start CONFIG
  $expertd --demo --config "$1" --socket "$sock" > "$work/daemon.log" 2>&1 &
  daemon=$!
  for _ in $(seq 1 240); do
    $ctl health --addr "$addr" > /dev/null 2>&1 && return 0
    kill -0 $daemon 2> /dev/null || { cat "$work/daemon.log"; exit 1; }
    sleep 0.25
  done
  echo "the daemon did not serve" >&2
  exit 1
}
stop() {
  kill -TERM $daemon
  wait $daemon
  daemon=
}
bench() {  # bench TRANSPORT OUT [extra args]
  local transport=$1 out=$2
  shift 2
  $ctl bench --addr "$addr" --trace "$trace" --gguf "$gguf" --limit "$limit" \
    --transport "$transport" --json --quiet "$@" > "$out"
}

printf '[device]\nslot_memory = "1023MiB"\n' > "$work/all-fit.toml"
printf '# the demo defaults: a quarter of the bundles fit\n' > "$work/quarter.toml"

echo "== all-fit: warm-up, then $rounds round(s) of stream and lane, $limit acquires each"
start "$work/all-fit.toml"
bench lane "$work/warm.json"
for r in $(seq 1 "$rounds"); do
  bench stream "$work/fit-stream-$r.json"
  bench lane "$work/fit-lane-$r.json"
done
for transport in lane stream; do
  echo "== 4 processes on the $transport at once"
  procs=()
  for p in 1 2 3 4; do
    bench $transport "$work/proc-$transport-$p.json" &
    procs+=($!)
  done
  for p in "${procs[@]}"; do wait "$p"; done
done
echo "== the protocol alone (--no-read): one session, then 4 processes, on the lane"
nobench() {  # nobench OUT: like bench, without reading (and so without verifying) the slots
  $ctl bench --addr "$addr" --trace "$trace" --limit "$limit" --transport lane --no-read --json \
    --quiet > "$1" 2> /dev/null
}
nobench "$work/noread-one.json"
procs=()
for p in 1 2 3 4; do
  nobench "$work/noread-$p.json" &
  procs+=($!)
done
for p in "${procs[@]}"; do wait "$p"; done
stop

echo "== quarter pool: $rounds round(s) of stream and lane"
start "$work/quarter.toml"
bench lane "$work/warm-q.json"
for r in $(seq 1 "$rounds"); do
  bench stream "$work/q-stream-$r.json"
  bench lane "$work/q-lane-$r.json"
done
stop

/usr/bin/python3 - "$work" "$rounds" <<'PY'
import glob, json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def load(pattern):
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{work}/{pattern}"))]
    for r in runs:
        assert r["errors"] == 0 and r["mismatches"] == 0 and r["verified"] == r["accesses"], r
    return runs
med = lambda runs, key: statistics.median(r[key] for r in runs)
fs, fl = load("fit-stream-*.json"), load("fit-lane-*.json")
assert all(r["transport"] == "stream" for r in fs) and all(r["transport"] == "lane" for r in fl)
procs = load("proc-lane-*.json")
procs_stream = load("proc-stream-*.json")
qs, ql = load("q-stream-*.json"), load("q-lane-*.json")
noread_one = json.load(open(f"{work}/noread-one.json"))
noread = [json.load(open(p)) for p in sorted(glob.glob(f"{work}/noread-[0-9].json"))]
for r in [noread_one] + noread:
    assert r["errors"] == 0 and r["transport"] == "lane", r
print(f"all-fit (hit rate lane {med(fl, 'hit_rate'):.3f}, stream {med(fs, 'hit_rate'):.3f}), "
      f"medians of {rounds} round(s):")
print(f"  {'':8} {'acquire p50':>12} {'p99':>8} {'acq+rel p50':>12} {'p99':>8}   (us)")
for name, runs in (("stream", fs), ("lane", fl)):
    print(f"  {name:8} {med(runs, 'acquire_p50_us'):12.1f} {med(runs, 'acquire_p99_us'):8.1f} "
          f"{med(runs, 'cycle_p50_us'):12.1f} {med(runs, 'cycle_p99_us'):8.1f}")
print(f"  lane/stream: acquire p50 {med(fl, 'acquire_p50_us') / med(fs, 'acquire_p50_us'):.3f}, "
      f"acquire+release p50 {med(fl, 'cycle_p50_us') / med(fs, 'cycle_p50_us'):.3f}")
p50s = [r["cycle_p50_us"] for r in procs]
print(f"4 processes on the lane: acquire+release p50 per process "
      f"{', '.join(f'{p:.1f}' for p in p50s)} us; worst / one session "
      f"{max(p50s) / med(fl, 'cycle_p50_us'):.2f}")
p50s = [r["cycle_p50_us"] for r in procs_stream]
print(f"4 processes on the stream: acquire+release p50 per process "
      f"{', '.join(f'{p:.1f}' for p in p50s)} us; worst / one session "
      f"{max(p50s) / med(fs, 'cycle_p50_us'):.2f}")
p50s = [r["cycle_p50_us"] for r in noread]
print(f"the protocol alone (--no-read) on the lane: one session {noread_one['cycle_p50_us']:.1f} us; "
      f"4 processes {', '.join(f'{p:.1f}' for p in p50s)} us; worst / one session "
      f"{max(p50s) / noread_one['cycle_p50_us']:.2f}")
print(f"quarter pool (hit rate lane {med(ql, 'hit_rate'):.3f}, stream {med(qs, 'hit_rate'):.3f}): "
      f"throughput lane {med(ql, 'throughput_bytes_per_s') / 2**20:.0f} MiB/s, stream "
      f"{med(qs, 'throughput_bytes_per_s') / 2**20:.0f} MiB/s, lane/stream "
      f"{med(ql, 'throughput_bytes_per_s') / med(qs, 'throughput_bytes_per_s'):.2f}")
PY
