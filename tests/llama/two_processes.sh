#!/usr/bin/env bash
# Two llama.cpp processes generate at the same time on one daemon with a quarter pool: both
# bitwise identical to stock.
#   two_processes.sh PRESET
source "$(dirname "$0")/llama_env.sh"
preset=$1
synth "$preset"
run_driver "$work/stock.bin" > "$work/stock.txt" 2> "$work/stock.err" || { cat "$work/stock.err"; fail "stock"; }
start_daemon $(( expert_bytes / 4 ))
for i in 1 2; do
  LLAMA_ARG_EXPERTD=unix://$sock run_driver "$work/p$i.bin" > "$work/p$i.txt" 2> "$work/p$i.err" &
  pids[$i]=$!
done
for i in 1 2; do
  wait "${pids[$i]}" || { tail -20 "$work/p$i.err"; fail "process $i"; }
done
evictions=$(stats_field evictions)
stop_daemon
for i in 1 2; do
  cmp -s "$work/stock.bin" "$work/p$i.bin" || fail "process $i: logits differ from stock"
done
echo "$preset: two processes at once on a quarter pool ($evictions evictions): both bitwise identical to stock"
echo "PASS"
