#!/usr/bin/env bash
# llama.cpp with and without expertd on one synthesized model, in one run (docs/performance.md,
# "llama.cpp on expertd"):
#
#   bench/llama_bench.sh [--scale S] [--steps N] [--prompt P] [--threads T] [--lane-spin US]
#
# Model: mixtral-tiny at scale S (default 16: 498 MiB of routed experts in 32 MoE layers). Each
# configuration runs tests/llama/llama_logits (a P-token prompt, default 64, then N greedy
# decode steps, default 64, T threads, default 2) under /usr/bin/time for the engine's peak RSS;
# the daemon's lane thread watches for the next request for US microseconds before it sleeps
# ([lane] spin_us, default: the daemon's default). After the daemon starts, one run of the
# prompt and one step loads the experts they route to, so the expertd-full runs that follow
# are all hits.
#   stock           llama.cpp loads the experts (weight repacking on: its default)
#   stock-norepack  the same with --no-repack
#   expertd-full    the experts from expertd, a pool holding all of them (repacking on for the
#                   rest of the model; the arenas are never repacked)
#   expertd-norepack, expertd-quarter   the same without repacking; with a quarter of them
#   stock-norepack-poll0, expertd-norepack-poll0   idle ggml workers sleep instead of spinning
#   stock-norepack-nommap   stock-norepack reading the file into memory instead of mapping it
#                   (as an expertd run loads the rest of the model)
# Prints a Markdown table: prompt and decode tokens/s, decode relative to stock-norepack, peak
# RSS and the private part of RSS at the end (the arenas are shared memory of the daemon), and
# for expertd runs what the extra time per token comes to per MoE layer (one acquire and one
# release each) beside what the acquire and release ops themselves took (mean and median wall
# time, from the change's log line). Needs build/llama (ctest -R llama.build, or
# tests/llama/build.sh build/llama).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scale=16 steps=64 prompt_len=64 threads=2 lane_spin=
while [ $# -gt 0 ]; do
  case $1 in
    --scale) scale=$2; shift ;;
    --steps) steps=$2; shift ;;
    --prompt) prompt_len=$2; shift ;;
    --threads) threads=$2; shift ;;
    --lane-spin) lane_spin=$2; shift ;;
    *) sed -n '2,/^set -euo/{/^#/p}' "$0" >&2; exit 2 ;;
  esac
  shift
done
llama_out=${LLAMA_OUT:-$root/build/llama}
driver=$llama_out/llama_logits
[ -x "$driver" ] || { echo "llama_bench: no $driver (run tests/llama/build.sh $llama_out)" >&2; exit 3; }
export LD_LIBRARY_PATH=$llama_out/bin:$root/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset LLAMA_ARG_EXPERTD LLAMA_ARG_EXPERTD_MODEL
work=$(mktemp -d)
daemon=
trap '[ -n "$daemon" ] && kill -9 $daemon 2>/dev/null; rm -rf "$work"' EXIT

cache=$root/build/bench-cache/mixtral-tiny-x$scale
if [ ! -f "$cache/model.gguf" ]; then
  echo "synthesizing mixtral-tiny at scale $scale into $cache" >&2
  "$root/build/bin/expertctl" synth --preset mixtral-tiny --scale "$scale" --out "$cache" --quiet > /dev/null
fi
model=$cache/model.gguf
read -r expert_bytes layers < <("$root/build/bin/expertctl" inspect "$model" --json |
  python3 -c 'import json,sys; m=json.load(sys.stdin)["moe"]; print(m["expert_bytes_total"], len(m["layer_blocks"]))')
tokens=$(python3 -c "print(','.join(['1'] + [str(300 + i % 700) for i in range(1, $prompt_len)]))")

start_daemon() {  # start_daemon SLOT_BYTES
  sock=$work/expertd.sock
  printf '[[model]]\nname = "bench"\ngguf = "%s"\n[device]\nkind = "host"\nslot_memory = %s\n[cache]\npolicy = "lru"\n[predictor]\nkind = "none"\n' \
    "$model" "$1" > "$work/expertd.toml"
  [ -z "$lane_spin" ] || printf '[lane]\nspin_us = %s\n' "$lane_spin" >> "$work/expertd.toml"
  "$root/build/bin/expertd" --config "$work/expertd.toml" --socket "$sock" > "$work/daemon.log" 2>&1 &
  daemon=$!
  for _ in $(seq 1 600); do
    "$root/build/bin/expertctl" health --addr "unix://$sock" > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "llama_bench: expertd did not start" >&2; tail "$work/daemon.log" >&2; exit 1
}
stop_daemon() { kill -TERM $daemon; wait $daemon || true; daemon=; }

# run NAME [driver args]: prints "pp_tps tg_tps ms_per_token peak_rss_mib private_mib ops", ops
# being "acquire mean/p50 us, release mean us" or "-".
run() {
  local name=$1; shift
  "$driver" "$model" "$work/$name.bin" --tokens "$tokens" \
    --steps "$steps" --threads "$threads" --ubatch "$prompt_len" "$@" > /dev/null 2> "$work/$name.err" ||
    { tail "$work/$name.err" >&2; echo "llama_bench: $name failed" >&2; exit 1; }
  python3 - "$work/$name.err" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
t = re.search(r"prompt (\d+) tokens in ([\d.]+) ms .* decode (\d+) tokens in ([\d.]+) ms", text)
m = re.search(r"peak rss (\d+) MiB; at the end rss \d+ MiB, private (\d+) MiB", text)
o = re.search(r"llama_expertd: acquire ops \d+, ([\d.]+) us mean, p50 (\d+), .*; release ops \d+, ([\d.]+) us mean", text)
pp = int(t.group(1)) * 1000 / float(t.group(2)); tg = int(t.group(3)) * 1000 / float(t.group(4))
ops = f"{o.group(1)}/{o.group(2)},{o.group(3)}" if o else "-"
print(f"{pp:.1f} {tg:.2f} {float(t.group(4)) / int(t.group(3)):.3f} {m.group(1)} {m.group(2)} {ops}")
PY
}

declare -A result
result[stock]=$(run stock)
result[stock-norepack]=$(run stock-norepack --no-repack)
result[stock-norepack-poll0]=$(run stock-norepack-poll0 --no-repack --poll 0)
result[stock-norepack-nommap]=$(run stock-norepack-nommap --no-repack --no-mmap)
start_daemon $(( expert_bytes * 2 ))
LLAMA_ARG_EXPERTD=unix://$sock steps=1 run warm-up --no-repack > /dev/null
result[expertd-full]=$(LLAMA_ARG_EXPERTD=unix://$sock run expertd-full)
result[expertd-norepack]=$(LLAMA_ARG_EXPERTD=unix://$sock run expertd-norepack --no-repack)
result[expertd-norepack-poll0]=$(LLAMA_ARG_EXPERTD=unix://$sock run expertd-norepack-poll0 --no-repack --poll 0)
stall_full=$("$root/build/bin/expertctl" stats --addr "unix://$sock" --json |
  python3 -c 'import json,sys; m=json.load(sys.stdin)["models"][0]; print(m["stall_p50_us"])')
stop_daemon
start_daemon $(( expert_bytes / 4 ))
result[expertd-quarter]=$(LLAMA_ARG_EXPERTD=unix://$sock run expertd-quarter --no-repack)
quarter_stats=$("$root/build/bin/expertctl" stats --addr "unix://$sock" --json |
  python3 -c 'import json,sys; m=json.load(sys.stdin)["models"][0]; print(m["hit_rate"], m["evictions"], m["stall_p50_us"])')
stop_daemon
cmp -s "$work/stock-norepack.bin" "$work/expertd-norepack.bin" || echo "WARNING: expertd-norepack logits differ from stock-norepack" >&2
cmp -s "$work/stock-norepack.bin" "$work/expertd-quarter.bin" || echo "WARNING: expertd-quarter logits differ from stock-norepack" >&2

read -r _ base_tg base_ms _ _ <<< "${result[stock-norepack]}"
read -r _ poll_tg poll_ms _ _ <<< "${result[stock-norepack-poll0]}"
echo "mixtral-tiny x$scale: $((expert_bytes >> 20)) MiB of routed experts, $layers MoE layers; prompt $prompt_len tokens, $steps decode steps, $threads threads"
echo
echo "| run | prompt tokens/s | decode tokens/s | decode vs stock-norepack (same polling) | peak RSS MiB | private MiB | extra ms/token | per MoE layer (us) | acquire op mean/p50, release op mean (us) |"
echo "|---|---|---|---|---|---|---|---|---|"
for name in stock stock-norepack stock-norepack-nommap expertd-full expertd-norepack expertd-quarter stock-norepack-poll0 expertd-norepack-poll0; do
  read -r pp tg ms rss priv ops <<< "${result[$name]}"
  if [[ $name == *poll0 ]]; then ref_tg=$poll_tg ref_ms=$poll_ms; else ref_tg=$base_tg ref_ms=$base_ms; fi
  python3 - "$name" "$pp" "$tg" "$ms" "$rss" "$priv" "$ref_tg" "$ref_ms" "$layers" "$ops" <<'PY'
import sys
name, pp, tg, ms, rss, priv, ref_tg, ref_ms, layers, ops = sys.argv[1:]
ratio = float(tg) / float(ref_tg)
extra = float(ms) - float(ref_ms)
per = f"{extra * 1000 / int(layers):.0f}" if name.startswith("expertd") else "-"
extra_s = f"{extra:+.3f}" if name.startswith("expertd") else "-"
print(f"| {name} | {pp} | {tg} | {ratio:.2f}x | {rss} | {priv} | {extra_s} | {per} | {ops.replace(',', ', ')} |")
PY
done
echo
echo "expertd-full: daemon-side acquire stall p50 ${stall_full} us (all hits); expertd-quarter: hit rate, evictions, stall p50 = $quarter_stats"
