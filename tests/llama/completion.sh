#!/usr/bin/env bash
# The stock tool llama-completion produces text from a synthesized model, loading the experts
# itself and with --expertd: the same greedy text both ways (weights not repacked).
#   completion.sh PRESET
source "$(dirname "$0")/llama_env.sh"
synth "$1"
tool=$llama_out/bin/llama-completion
[ -x "$tool" ] || fail "no llama-completion in $llama_out/bin"
args=(-m "$model" -p "Hello world" -n 24 -t 2 --temp 0 --no-repack -no-cnv --no-warmup)
timeout 120 "$tool" "${args[@]}" > "$work/stock.txt" 2> "$work/stock.err" ||
  { tail "$work/stock.err"; fail "llama-completion"; }
start_daemon 64MiB
timeout 120 "$tool" "${args[@]}" --expertd "unix://$sock" > "$work/expertd.txt" 2> "$work/expertd.err" ||
  { tail "$work/expertd.err"; fail "llama-completion --expertd"; }
acquires=$(stats_field accesses)
stop_daemon
[ "$acquires" -gt 0 ] || fail "llama-completion --expertd acquired nothing"
text=$(cat "$work/stock.txt")
[ ${#text} -gt $(( ${#args[3]} + 10 )) ] || fail "no text after the prompt: '$text'"
cmp -s "$work/stock.txt" "$work/expertd.txt" ||
  fail "the text differs: stock '$text', expertd '$(cat "$work/expertd.txt")'"
echo "$1: llama-completion wrote the same ${#text} characters both ways ($acquires expert accesses through expertd): $text"
echo "PASS"
