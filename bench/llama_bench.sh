#!/usr/bin/env bash
# llama.cpp with and without expertd on one synthesized model, in one run (docs/performance.md,
# "llama.cpp on expertd"):
#
#   bench/llama_bench.sh [--scale S] [--steps N] [--prompt P] [--threads T] [--lane-spin US]
#                        [--reps R]
#
# Model: mixtral-tiny at scale S (default 16: 498 MiB of routed experts in 32 MoE layers). Each
# configuration runs tests/llama/llama_logits (a P-token prompt, default 64, then N greedy
# decode steps, default 64, T threads, default 2) under /usr/bin/time for the engine's peak RSS;
# the daemon's lane thread watches for the next request for US microseconds before it sleeps
# ([lane] spin_us, default: the daemon's default). Three daemons serve the model, one with a pool
# holding every expert, one with a quarter of them and one with every expert and client-side hits
# off; after they start, one run of the prompt and one step loads the experts they route to into
# the two full pools, so their runs are all hits. R reps
# (default 3) each run every configuration once, in the order listed here, so that stock and
# expertd runs alternate over a drift of the machine's speed.
#   stock           llama.cpp loads the experts (weight repacking on: its default)
#   stock-norepack  the same with --no-repack
#   expertd-full    the experts from expertd, a pool holding all of them (repacking on for the
#                   rest of the model; the arenas are never repacked)
#   expertd-norepack, expertd-quarter   the same without repacking; with a quarter of them
#   expertd-norepack-asked   expertd-norepack on a third daemon (a full pool) with client-side
#                   hits off ([lane] client_hits = false): every acquire is a round trip
#   stock-norepack-poll0, expertd-norepack-poll0   idle ggml workers sleep instead of spinning
#   stock-norepack-nommap   stock-norepack reading the file into memory instead of mapping it
#                   (as an expertd run loads the rest of the model)
# Prints a Markdown table, each row the configuration's median rep by decode relative to
# stock-norepack in the same rep (with that ratio's range over the reps): prompt and decode
# tokens/s, the ratio, peak RSS and the private part of RSS at the end (the arenas are shared
# memory of the daemon), and for expertd runs what the extra time per token comes to per MoE layer (one acquire and one
# release each) beside what the acquire and release ops themselves took (mean and median wall
# time, from the change's log line) and how long the acquire op's other thread took to run
# again once the slots were there (it sleeps meanwhile). Needs build/llama (ctest -R llama.build, or
# tests/llama/build.sh build/llama).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scale=16 steps=64 prompt_len=64 threads=2 lane_spin= reps=3
while [ $# -gt 0 ]; do
  case $1 in
    --scale) scale=$2; shift ;;
    --steps) steps=$2; shift ;;
    --prompt) prompt_len=$2; shift ;;
    --threads) threads=$2; shift ;;
    --lane-spin) lane_spin=$2; shift ;;
    --reps) reps=$2; shift ;;
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
daemons=()
trap '[ ${#daemons[@]} -eq 0 ] || kill -9 "${daemons[@]}" 2>/dev/null; rm -rf "$work"' EXIT

cache=$root/build/bench-cache/mixtral-tiny-x$scale
if [ ! -f "$cache/model.gguf" ]; then
  echo "synthesizing mixtral-tiny at scale $scale into $cache" >&2
  "$root/build/bin/expertctl" synth --preset mixtral-tiny --scale "$scale" --out "$cache" --quiet > /dev/null
fi
model=$cache/model.gguf
read -r expert_bytes layers < <("$root/build/bin/expertctl" inspect "$model" --json |
  python3 -c 'import json,sys; m=json.load(sys.stdin)["moe"]; print(m["expert_bytes_total"], len(m["layer_blocks"]))')
tokens=$(python3 -c "print(','.join(['1'] + [str(300 + i % 700) for i in range(1, $prompt_len)]))")

start_daemon() {  # start_daemon SLOT_BYTES NAME [CLIENT_HITS]: a daemon on $work/NAME.sock
  local sock=$work/$2.sock conf=$work/$2.toml
  printf '[[model]]\nname = "bench"\ngguf = "%s"\n[device]\nkind = "host"\nslot_memory = %s\n[cache]\npolicy = "lru"\n[predictor]\nkind = "none"\n' \
    "$model" "$1" > "$conf"
  printf '[lane]\nclient_hits = %s\n' "${3:-true}" >> "$conf"
  [ -z "$lane_spin" ] || printf 'spin_us = %s\n' "$lane_spin" >> "$conf"
  "$root/build/bin/expertd" --config "$conf" --socket "$sock" > "$work/$2.log" 2>&1 &
  daemons+=($!)
  for _ in $(seq 1 600); do
    "$root/build/bin/expertctl" health --addr "unix://$sock" > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "llama_bench: expertd ($2) did not start" >&2; tail "$work/$2.log" >&2; exit 1
}
stop_daemons() { kill -TERM "${daemons[@]}"; wait "${daemons[@]}" || true; daemons=(); }

# run NAME [driver args]: prints "pp_tps tg_tps ms_per_token peak_rss_mib private_mib ops", ops
# being "acquire mean/p50 us, release mean us, wake-up mean/p50 us" or "-".
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
o = re.search(r"llama_expertd: acquire ops \d+, ([\d.]+) us mean, p50 (\d+), .*; release ops \d+, ([\d.]+) us mean.*"
              r"; wake-ups after an acquire \d+, ([\d.]+) us mean, p50 (\d+)", text)
pp = int(t.group(1)) * 1000 / float(t.group(2)); tg = int(t.group(3)) * 1000 / float(t.group(4))
ops = f"{o.group(1)}/{o.group(2)},{o.group(3)},{o.group(4)}/{o.group(5)}" if o else "-"
print(f"{pp:.1f} {tg:.2f} {float(t.group(4)) / int(t.group(3)):.3f} {m.group(1)} {m.group(2)} {ops}")
PY
}

# Each rep runs every configuration once, stock and expertd interleaved, both daemons up the
# whole time (the quarter one on its own socket); the table gives each configuration's median
# rep and the range of its decode ratio over the reps.
start_daemon $(( expert_bytes * 2 )) full
start_daemon $(( expert_bytes / 4 )) quarter
start_daemon $(( expert_bytes * 2 )) asked false
LLAMA_ARG_EXPERTD=unix://$work/full.sock steps=1 run warm-up --no-repack > /dev/null
LLAMA_ARG_EXPERTD=unix://$work/asked.sock steps=1 run warm-up --no-repack > /dev/null
rows=$work/rows
: > "$rows"
for rep in $(seq 1 "$reps"); do
  [ "$reps" = 1 ] || echo "rep $rep of $reps" >&2
  for name in stock stock-norepack expertd-full expertd-norepack expertd-norepack-asked \
              expertd-quarter stock-norepack-poll0 expertd-norepack-poll0 stock-norepack-nommap; do
    args=()
    [ "$name" = stock ] || [ "$name" = expertd-full ] || args+=(--no-repack)
    [[ $name != *poll0 ]] || args+=(--poll 0)
    [[ $name != *nommap ]] || args+=(--no-mmap)
    case $name in
      expertd-quarter) addr=unix://$work/quarter.sock ;;
      expertd-*-asked) addr=unix://$work/asked.sock ;;
      expertd-*) addr=unix://$work/full.sock ;;
      *) addr= ;;
    esac
    if [ -n "$addr" ]; then
      echo "$name $rep $(LLAMA_ARG_EXPERTD=$addr run "$name" "${args[@]}")" >> "$rows"
    else
      echo "$name $rep $(run "$name" "${args[@]}")" >> "$rows"
    fi
    case $name in
      expertd-norepack|expertd-norepack-asked|expertd-quarter)
        cmp -s "$work/stock-norepack.bin" "$work/$name.bin" ||
          echo "WARNING: $name logits differ from stock-norepack (rep $rep)" >&2 ;;
    esac
  done
done
full_stats=$("$root/build/bin/expertctl" stats --addr "unix://$work/full.sock" --json |
  python3 -c 'import json,sys; m=json.load(sys.stdin)["models"][0]; print(m["accesses"], m["client_hits"], m["stall_p50_us"])')
asked_stall=$("$root/build/bin/expertctl" stats --addr "unix://$work/asked.sock" --json |
  python3 -c 'import json,sys; m=json.load(sys.stdin)["models"][0]; print(m["stall_p50_us"])')
quarter_stats=$("$root/build/bin/expertctl" stats --addr "unix://$work/quarter.sock" --json |
  python3 -c 'import json,sys; m=json.load(sys.stdin)["models"][0]; print(m["hit_rate"], m["evictions"], m["client_hits"], m["stall_p50_us"])')
stop_daemons

echo "mixtral-tiny x$scale: $((expert_bytes >> 20)) MiB of routed experts, $layers MoE layers; prompt $prompt_len tokens, $steps decode steps, $threads threads, $reps rep(s)"
echo
python3 - "$rows" "$layers" <<'PY'
import statistics, sys
rows, layers = sys.argv[1], int(sys.argv[2])
runs = {}
for line in open(rows):
    name, rep, pp, tg, ms, rss, priv, ops = line.split()
    runs.setdefault(name, {})[int(rep)] = (float(pp), float(tg), float(ms), rss, priv, ops)
def ref(name):
    return "stock-norepack-poll0" if name.endswith("poll0") else "stock-norepack"
print("| run | prompt tokens/s | decode tokens/s | decode vs stock-norepack (same polling), median [range] | peak RSS MiB | private MiB | extra ms/token | per MoE layer (us) | acquire op mean/p50, release op mean, wake-up mean/p50 (us) |")
print("|---|---|---|---|---|---|---|---|---|")
order = ["stock", "stock-norepack", "stock-norepack-nommap", "expertd-full", "expertd-norepack",
         "expertd-norepack-asked", "expertd-quarter", "stock-norepack-poll0", "expertd-norepack-poll0"]
for name in order:
    reps = runs[name]
    base = runs[ref(name)]
    ratio = {r: reps[r][1] / base[r][1] for r in reps}
    extra = {r: reps[r][2] - base[r][2] for r in reps}
    mid = sorted(reps, key=lambda r: ratio[r])[(len(reps) - 1) // 2]  # the median rep
    pp, tg, ms, rss, priv, ops = reps[mid]
    lo, hi = min(ratio.values()), max(ratio.values())
    span = f" [{lo:.2f}-{hi:.2f}]" if len(reps) > 1 else ""
    is_ex = name.startswith("expertd")
    extra_s = f"{extra[mid]:+.3f}" if is_ex else "-"
    per = f"{extra[mid] * 1000 / layers:.0f}" if is_ex else "-"
    print(f"| {name} | {pp:.1f} | {tg:.2f} | {ratio[mid]:.2f}x{span} | {rss} | {priv} | {extra_s} | {per} | {ops.replace(',', ', ')} |")
PY
echo
echo "full pool: expert accesses, client-side hits, daemon-side stall p50 (us) = $full_stats;" \
     "expertd-norepack-asked: daemon-side stall p50 $asked_stall us;" \
     "quarter pool: hit rate, evictions, client-side hits, stall p50 (us) = $quarter_stats"
