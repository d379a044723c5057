# Shared by the llama tests (sourced): the llama.cpp build, a synthesized model, a daemon serving
# it, and the logits driver.
#   LLAMA_OUT   the scripts/llama-build output folder (default: build/llama beside the tests)
# Every function fails the test with a message; a missing llama.cpp build skips it (exit 77).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
fail() { echo "FAIL: $*" >&2; for f in "$work"/daemon*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }

llama_out=${LLAMA_OUT:-$root/build/llama}
driver=$llama_out/llama_logits
if [ ! -x "$driver" ]; then
  echo "SKIP: no llama.cpp build with expertd's change at $llama_out ($(cat "$llama_out/SKIPPED" 2>/dev/null || echo 'run the llama.build test or scripts/llama-build'))"
  exit 77
fi
export LD_LIBRARY_PATH=$llama_out/bin:$root/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset LLAMA_ARG_EXPERTD LLAMA_ARG_EXPERTD_MODEL

work=$(mktemp -d)
daemon_pid=
cleanup() {
  [ -n "$daemon_pid" ] && kill -9 "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# synth PRESET: the model at $work/m/model.gguf (seed 7).
synth() {
  "$root/build/bin/expertctl" synth --preset "$1" --out "$work/m" --seed 7 --quiet > /dev/null ||
    fail "synth $1"
  model=$work/m/model.gguf
  read -r expert_bytes bundles top_k < <("$root/build/bin/expertctl" inspect "$model" --json |
    python3 -c 'import json,sys; m=json.load(sys.stdin)["moe"]
print(m["expert_bytes_total"], len(m["layer_blocks"]) * m["n_expert"], m["n_expert_used"])')
}

# start_daemon SLOT_MEMORY [NAME [LEASE_TTL]]: expertd serving $model on the host device.
start_daemon() {
  sock=$work/run/expertd.sock
  local slot=$1
  case $slot in *[!0-9]*) slot="\"$slot\"" ;; esac  # a bare integer is bytes
  cat > "$work/expertd.toml" <<TOML
[[model]]
name = "${2:-synth}"
gguf = "$model"
[device]
kind = "host"
slot_memory = $slot
[cache]
policy = "lru"
[predictor]
kind = "none"
[limits]
max_experts_per_acquire = 256
lease_ttl = "${3:-60s}"
TOML
  "$root/build/bin/expertd" --config "$work/expertd.toml" --socket "$sock" > "$work/daemon.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 1 300); do
    "$root/build/bin/expertctl" health --addr "unix://$sock" > /dev/null 2>&1 && return 0
    kill -0 "$daemon_pid" 2>/dev/null || fail "expertd exited at start"
    sleep 0.1
  done
  fail "expertd did not become healthy"
}

stop_daemon() {
  kill -TERM "$daemon_pid"
  wait "$daemon_pid" || fail "expertd exit $? after SIGTERM"
  daemon_pid=
}

# stats_field FIELD: a counter of the served model from expertctl stats --json.
stats_field() {
  "$root/build/bin/expertctl" stats --addr "unix://$sock" --json |
    python3 -c "import json,sys; j=json.load(sys.stdin); print(j['models'][0]['$1'])"
}

# run_driver OUT [ARGS...]: a fixed prompt of 32 token ids (BOS and 31 distinct ones, so that
# routes vary) in micro-batches of 4 tokens (so that a quarter pool holds every expert one
# micro-batch routes to), then 32 greedy steps, 2 threads, weights not repacked.
prompt_ids=1,$(seq -s, 300 17 827)
run_driver() {
  local out=$1; shift
  "$driver" "$model" "$out" --tokens "$prompt_ids" --no-repack --threads 2 --steps 32 --ubatch 4 "$@"
}
