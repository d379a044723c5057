#!/usr/bin/env bash
# Two GPUs (the simulator's EXPERTD_CUDASIM_DEVICES=2): expertd with cuda_devices = [0, 1]
# loads the model once per device, a session names its device, and each device's slot pool
# moves only its own sessions' bytes. expertctl bench verifies every granted slot against the
# GGUF on each device; an unknown device is refused with its name. Clients that see the two
# GPUs in the other order (EXPERTD_CUDASIM_VISIBLE_DEVICES=1,0, like CUDA_VISIBLE_DEVICES) find
# the daemon's GPU by its UUID: the bench verifies every slot again, and daemon_cuda_client
# devices (a thread that never chose a device) creates a context on that GPU only, maps nothing
# over the peer link, and has a stream of the other GPU refused.
#   daemon_two_gpus.sh EXPERTD EXPERTCTL TRACE DAEMON_CUDA_CLIENT   (the cudasim builds)
set -euo pipefail
expertd=$1 ctl=$2 trace=$3 client=$4
work=$(mktemp -d)
daemon=
cleanup() {
  [ -n "$daemon" ] && kill -9 "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; tail -30 "$work/daemon.log"; exit 1; }
export EXPERTD_CUDASIM_DEVICES=2 XDG_CACHE_HOME=$work/cache
sock=$work/run/expertd.sock
addr=unix://$sock
printf '[device]\nkind = "cuda"\ncuda_devices = [0, 1]\nslot_memory = "4MiB"\n' > "$work/expertd.toml"
"$expertd" --demo --config "$work/expertd.toml" --socket "$sock" > "$work/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 1 600); do "$ctl" health --addr "$addr" --service demo > /dev/null 2>&1 && break; sleep 0.1; done
"$ctl" health --addr "$addr" --service demo > /dev/null || fail "the daemon never served"
gguf=$XDG_CACHE_HOME/expertd/demo/model.gguf

# copied DEVICE: bytes copied into the demo model's slots on DEVICE so far.
copied() {
  "$ctl" stats --addr "$addr" --json | python3 -c '
import json, sys
stats = json.load(sys.stdin)
print(sum(m["bytes_copied"] for m in stats["models"] if m["model"] == "demo" and m["device"] == sys.argv[1]))
' "$1"
}
bench() {  # bench DEVICE: 2 sessions on DEVICE, 400 acquires each, every slot checked
  "$ctl" bench --addr "$addr" --trace "$trace" --gguf "$gguf" --sessions 2 --limit 400 --json \
    --device "$1" > "$work/bench.json" || fail "expertctl bench --device $1"
  python3 - "$work/bench.json" "$1" <<'PY' || fail "bench on $1 saw wrong bytes"
import json, sys
b = json.load(open(sys.argv[1]))
print(f"RESULT two-gpus device={sys.argv[2]} verified={b['verified']} mismatches={b['mismatches']} errors={b['errors']}")
sys.exit(0 if b["verified"] > 0 and b["mismatches"] == 0 and b["errors"] == 0 else 1)
PY
}

grep -q 'serving from device cuda:1' "$work/daemon.log" || fail "no pool on cuda:1"
grep -q 'model demo on cuda:1: ' "$work/daemon.log" || fail "the model was not loaded on cuda:1"
bench cuda:1
c0=$(copied cuda:0) c1=$(copied cuda:1)
echo "after the cuda:1 bench: copied cuda:0=$c0 cuda:1=$c1"
[ "$c0" = 0 ] && [ "$c1" -gt 0 ] || fail "cuda:1 sessions moved bytes on the wrong device"
bench cuda:0
c0b=$(copied cuda:0) c1b=$(copied cuda:1)
echo "after the cuda:0 bench: copied cuda:0=$c0b cuda:1=$c1b"
[ "$c0b" -gt 0 ] && [ "$c1b" = "$c1" ] || fail "cuda:0 sessions moved bytes on the wrong device"
echo "== clients that see the GPUs as 1,0"
EXPERTD_CUDASIM_VISIBLE_DEVICES=1,0 bench cuda:1
EXPERTD_CUDASIM_VISIBLE_DEVICES=1,0 "$client" devices "$addr" > "$work/devices.log" 2>&1 \
  || { cat "$work/devices.log"; fail "daemon_cuda_client devices"; }
grep -E 'is cuda:|refused|RESULT' "$work/devices.log" | cut -c1-200
# The default session is on the daemon's cuda:0 (physical device 0), this client's cuda:1.
grep -q 'is cuda:1 here' "$work/devices.log" || fail "the client did not resolve the GPU by UUID"
grep -q 'RESULT contexts=1 peer=0 wrong=0' "$work/devices.log" \
  || fail "a context on another GPU, a peer mapping or a refused record (see RESULT above)"
if "$ctl" bench --addr "$addr" --trace "$trace" --limit 1 --device cuda:7 --quiet \
    > "$work/bad.log" 2>&1; then
  fail "a session on cuda:7 was opened"
fi
grep -q 'cuda:7' "$work/bad.log" || { cat "$work/bad.log"; fail "the refusal does not name cuda:7"; }
echo "refused: $(head -1 "$work/bad.log" | cut -c1-160)"
kill -TERM $daemon
rc=0
wait $daemon || rc=$?
daemon=
[ $rc = 0 ] || fail "daemon exit $rc after SIGTERM"
echo "PASS"
