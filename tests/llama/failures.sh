#!/usr/bin/env bash
# How llama.cpp on expertd fails: no daemon at the address (a clear error naming it), a served
# model that is not the file's (refused, naming the difference), the daemon killed mid-generation
# (a clear error within seconds; no hang, no crash), and leases the daemon reclaims while the
# engine is stopped (the run fails naming the reclaim).
#   failures.sh
source "$(dirname "$0")/llama_env.sh"
synth mixtral-tiny

echo "== no daemon at the address"
rc=0
LLAMA_ARG_EXPERTD=unix://$work/nobody.sock timeout 60 "$driver" "$model" "$work/x.bin" --steps 1 \
  > /dev/null 2> "$work/nodaemon.err" || rc=$?
[ $rc = 2 ] || { tail "$work/nodaemon.err"; fail "no daemon: exit $rc, expected 2 (load refused)"; }
grep -q "cannot reach the daemon at unix://$work/nobody.sock" "$work/nodaemon.err" ||
  { tail "$work/nodaemon.err"; fail "no daemon: the error does not name the address"; }
grep "cannot reach" "$work/nodaemon.err" | head -1

echo "== a served model that is not this file"
other=$work/other
"$root/build/bin/expertctl" synth --preset qwen3moe-tiny --out "$other" --seed 7 --quiet > /dev/null
mine=$model
model=$other/model.gguf
start_daemon 64MiB
model=$mine
rc=0
LLAMA_ARG_EXPERTD=unix://$sock timeout 60 "$driver" "$model" "$work/x.bin" --steps 1 \
  > /dev/null 2> "$work/mismatch.err" || rc=$?
[ $rc = 2 ] || fail "another architecture: exit $rc, expected 2"
grep -q "no model the daemon serves matches this file" "$work/mismatch.err" ||
  { tail "$work/mismatch.err"; fail "another architecture: no clear refusal"; }
grep -m1 "matches this file" "$work/mismatch.err"
stop_daemon
# Same shape, other weights (another seed), named explicitly: refused after comparing bytes.
"$root/build/bin/expertctl" synth --preset mixtral-tiny --out "$other" --seed 8 --quiet > /dev/null
model=$other/model.gguf
start_daemon 64MiB twin
model=$mine
rc=0
LLAMA_ARG_EXPERTD=unix://$sock LLAMA_ARG_EXPERTD_MODEL=twin timeout 60 "$driver" "$model" "$work/x.bin" \
  --steps 1 > /dev/null 2> "$work/twin.err" || rc=$?
[ $rc = 2 ] || fail "same shape, other weights: exit $rc, expected 2"
grep -q "holds other weights than this file" "$work/twin.err" ||
  { tail "$work/twin.err"; fail "same shape, other weights: not refused"; }
grep -m1 "other weights" "$work/twin.err"
stop_daemon

echo "== the daemon killed mid-generation"
start_daemon 64MiB
LLAMA_ARG_EXPERTD=unix://$sock "$driver" "$model" "$work/long.bin" --no-repack --steps 4000 --ctx 4200 \
  > /dev/null 2> "$work/killed.err" &
engine=$!
for _ in $(seq 1 600); do grep -q "^step 0" "$work/killed.err" && break; sleep 0.1; done
grep -q "^step 0" "$work/killed.err" || fail "the engine never started generating"
sleep 0.5
kill -9 "$daemon_pid"
daemon_pid=
killed_at=$(date +%s%N)
rc=0
for _ in $(seq 1 200); do kill -0 $engine 2>/dev/null || break; sleep 0.05; done
if kill -0 $engine 2>/dev/null; then kill -9 $engine; fail "the engine still runs 10 s after the daemon died"; fi
wait $engine || rc=$?
ms=$(( ($(date +%s%N) - killed_at) / 1000000 ))
[ $rc = 1 ] || { tail "$work/killed.err"; fail "daemon killed: engine exit $rc, expected 1 (>128: it crashed)"; }
grep -q "expertd: layer .*UNAVAILABLE" "$work/killed.err" ||
  { tail "$work/killed.err"; fail "daemon killed: no clear error"; }
echo "engine stopped ${ms} ms after the daemon died: $(grep -m1 'expertd: layer' "$work/killed.err")"

echo "== leases reclaimed while the engine is stopped"
# Experts 16 times wider, so that the engine holds a lease most of the time; leases live 100 ms
# once the session goes quiet; the engine is stopped for 400 ms at random moments.
"$root/build/bin/expertctl" synth --preset mixtral-tiny --scale 16 --out "$work/wide" --seed 7 --quiet > /dev/null
model=$work/wide/model.gguf
start_daemon 1GiB synth 100ms
# The driver itself in the background (not through a function: $! must be its pid).
LLAMA_ARG_EXPERTD=unix://$sock "$driver" "$model" "$work/ttl.bin" --tokens "$prompt_ids" --no-repack \
  --threads 2 --steps 150 --ubatch 4 --ctx 256 > /dev/null 2> "$work/ttl.err" &
engine=$!
for _ in $(seq 1 600); do grep -q "^step 0" "$work/ttl.err" && break; sleep 0.1; done
cycles=0
while kill -0 $engine 2>/dev/null && [ $cycles -lt 30 ] && ! grep -q reclaimed "$work/daemon.log"; do
  sleep "0.0$(( RANDOM % 9 + 1 ))"
  kill -STOP $engine 2>/dev/null || break
  sleep 0.4
  kill -CONT $engine 2>/dev/null || break
  cycles=$((cycles + 1))
done
rc=0
wait $engine || rc=$?
reclaims=$(grep -c "reclaimed" "$work/daemon.log" || true)
# A run that never caught a held lease tested nothing: it fails too.
[ "$reclaims" -gt 0 ] || fail "$cycles stop(s) never caught a held lease (engine exit $rc)"
[ $rc = 1 ] || { tail "$work/ttl.err"; fail "$reclaims lease(s) reclaimed, yet the engine exited $rc"; }
grep -q "reclaimed" "$work/ttl.err" || { tail "$work/ttl.err"; fail "the engine's error does not name the reclaim"; }
echo "$reclaims lease(s) reclaimed after $cycles stop(s): $(grep -m1 'reclaimed' "$work/ttl.err")"
echo "PASS"
