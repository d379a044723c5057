#!/usr/bin/env bash
# llama.cpp on expertd gives bitwise the logits of llama.cpp loading the experts itself: the same
# build, threads, prompt of token ids and 32 greedy steps, weight repacking off on both sides
# (the arenas hold the GGUF layout). Once with a pool holding every expert, once with a quarter
# of them, or less when the run touches fewer (evictions mid-generation, counted).
#   identity.sh PRESET
source "$(dirname "$0")/llama_env.sh"
preset=$1
synth "$preset"

run_driver "$work/stock.bin" > "$work/stock.txt" 2> "$work/stock.err" ||
  { cat "$work/stock.err"; fail "stock llama.cpp on $preset"; }
echo "stock $(cat "$work/stock.txt")"
grep -q "served by expertd" "$work/stock.err" && fail "the stock run used expertd"

for pool in full quarter; do
  if [ $pool = full ]; then
    slot=$(( expert_bytes * 2 ))
  else
    # A quarter of the bundles; when the run touches no more than that (a random router favours
    # a few experts), half of what it touched, but never less than one micro-batch can need.
    slots=$(( bundles / 4 ))
    if [ "$touched" -le "$slots" ]; then
      slots=$(( touched / 2 ))
      [ $slots -ge $(( 4 * top_k + 8 )) ] || slots=$(( 4 * top_k + 8 ))
    fi
    slot=$(( expert_bytes * slots / bundles ))
  fi
  start_daemon "$slot"
  LLAMA_ARG_EXPERTD=unix://$sock run_driver "$work/$pool.bin" > "$work/$pool.txt" 2> "$work/$pool.err" ||
    { tail -20 "$work/$pool.err"; fail "llama.cpp on expertd ($pool pool) on $preset"; }
  grep -q "served by expertd" "$work/$pool.err" || { tail -20 "$work/$pool.err"; fail "the run did not use expertd"; }
  evictions=$(stats_field evictions)
  misses=$(stats_field misses)
  accesses=$(stats_field accesses)
  client_hits=$(stats_field client_hits)
  stop_daemon
  [ $pool = full ] && touched=$misses
  if ! cmp -s "$work/stock.bin" "$work/$pool.bin"; then
    cmp "$work/stock.bin" "$work/$pool.bin" | head -1
    fail "$preset, $pool pool: logits differ from stock ($(cat "$work/$pool.txt"))"
  fi
  echo "$preset, $pool pool ($slot of $expert_bytes bytes, $bundles bundles): 33 logit rows bitwise identical to stock;" \
       "$accesses expert accesses, $misses misses, $evictions evictions, $client_hits client-side hits"
  if [ $pool = quarter ] && [ "$evictions" -eq 0 ]; then
    fail "a quarter pool evicted nothing: the test did not exercise eviction"
  fi
  # With every expert resident after the prompt, decode acquires are served in the engine's
  # process (client-side hits).
  if [ $pool = full ] && [ "$client_hits" -eq 0 ]; then
    fail "no acquire was served in the engine's process (client-side hits) with a full pool"
  fi
done
echo "PASS"
