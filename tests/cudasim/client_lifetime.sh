#!/usr/bin/env bash
# Runs cudasim_client_lifetime against the simulator's expertd --demo on cuda:0.
#   client_lifetime.sh EXPERTD DAEMON_CUDA_CLIENT CUDASIM_CLIENT_LIFETIME   (the cudasim builds)
set -euo pipefail
expertd=$1 waiter=$2 lifetime=$3
work=$(mktemp -d)
daemon=
cleanup() {
  [ -n "$daemon" ] && kill -9 "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export XDG_CACHE_HOME=$work/cache
sock=$work/run/expertd.sock
printf '[device]\nkind = "cuda"\ncuda_devices = [0]\nslot_memory = "4MiB"\n' > "$work/expertd.toml"
"$expertd" --demo --config "$work/expertd.toml" --socket "$sock" > "$work/daemon.log" 2>&1 &
daemon=$!
"$waiter" wait "unix://$sock" 120 || { tail -20 "$work/daemon.log"; exit 1; }
rc=0
gguf=$XDG_CACHE_HOME/expertd/demo/model.gguf
python3 "$(dirname "$0")/../support/gguf_tensors.py" --offsets "$gguf" > "$work/tensors.txt"
"$lifetime" "unix://$sock" "$gguf" "$work/tensors.txt" || rc=$?
kill -TERM $daemon
drc=0
wait $daemon || drc=$?
daemon=
[ $drc = 0 ] || { echo "FAIL: daemon exit $drc after SIGTERM"; tail -20 "$work/daemon.log"; exit 1; }
exit $rc
