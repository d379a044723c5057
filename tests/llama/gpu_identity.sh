#!/usr/bin/env bash
# llama.cpp on expertd on a GPU (label gpu; scripts/gpu-check step 09-llama): for each synth
# preset, stock llama.cpp with every layer on the GPU (--ngl 99) against the same build reading
# the routed experts from expertd serving on cuda:0 — the slot arenas become CUDA tensors over
# the client library's IPC mappings. A fixed prompt of 32 token ids, 32 greedy steps. Passes when
# both runs decode the same tokens with finite logits that differ from stock by at most 1e-3 of
# the largest logit (printed: whether they are bitwise identical, and the largest difference);
# the daemon's pool holds every expert. Exit 77 (skip) without a CUDA GPU.
#   gpu_identity.sh EXPERTD EXPERTCTL LLAMA_LOGITS [PRESET...]
set -euo pipefail
expertd=$1 ctl=$2 driver=$3
shift 3
if [ ! -x "$driver" ]; then
  echo "SKIP: no llama.cpp built with --cuda at $driver (tests/llama/build.sh --cuda DIR)"
  exit 77
fi
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(mixtral-tiny qwen3moe-tiny deepseek-tiny gptoss-tiny)
work=$(mktemp -d)
daemon=
trap '[ -z "$daemon" ] || kill -9 $daemon 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [ -f "$work/daemon.log" ] && tail -20 "$work/daemon.log"; exit 1; }
unset LLAMA_ARG_EXPERTD LLAMA_ARG_EXPERTD_MODEL
tokens=$(python3 -c "print(','.join(['1'] + [str(300 + 7 * i) for i in range(1, 32)]))")
rc=0
for preset in "${presets[@]}"; do
  rm -rf "$work/m"
  "$ctl" synth --preset "$preset" --out "$work/m" --seed 7 --quiet > /dev/null || fail "synth $preset"
  model=$work/m/model.gguf
  expert_bytes=$("$ctl" inspect "$model" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["moe"]["expert_bytes_total"])')
  sock=$work/expertd.sock
  printf '[[model]]\nname = "synth"\ngguf = "%s"\n[device]\nkind = "cuda"\nslot_memory = %s\n[cache]\npolicy = "lru"\n[predictor]\nkind = "none"\n[limits]\nmax_experts_per_acquire = 256\n' \
    "$model" $(( expert_bytes * 2 )) > "$work/expertd.toml"
  "$expertd" --config "$work/expertd.toml" --socket "$sock" > "$work/daemon.log" 2>&1 &
  daemon=$!
  for _ in $(seq 1 300); do
    "$ctl" health --addr "unix://$sock" > /dev/null 2>&1 && break
    kill -0 $daemon 2>/dev/null || break
    sleep 0.1
  done
  if ! kill -0 $daemon 2>/dev/null; then
    if grep -q "no usable CUDA GPU" "$work/daemon.log"; then
      echo "SKIP: no CUDA GPU here ($(grep -m1 'no usable CUDA GPU' "$work/daemon.log" | cut -c1-160))"
      exit 77
    fi
    fail "expertd did not start on cuda"
  fi
  "$ctl" health --addr "unix://$sock" > /dev/null 2>&1 || fail "expertd did not become healthy"
  "$driver" "$model" "$work/stock.bin" --tokens "$tokens" --steps 32 --ngl 99 > "$work/stock.txt" \
    2> "$work/stock.err" || { tail "$work/stock.err"; fail "$preset: stock llama.cpp on the GPU"; }
  grep -q "CUDA" "$work/stock.err" || fail "$preset: the stock run did not use the CUDA backend"
  LLAMA_ARG_EXPERTD=unix://$sock "$driver" "$model" "$work/expertd.bin" --tokens "$tokens" \
    --steps 32 --ngl 99 > "$work/expertd.txt" 2> "$work/expertd.err" ||
    { tail -20 "$work/expertd.err"; fail "$preset: llama.cpp on expertd on the GPU"; }
  grep -q "served by expertd" "$work/expertd.err" || fail "$preset: the expertd run did not use expertd"
  grep -m1 "llama_expertd: acquire ops" "$work/expertd.err" || true
  kill -TERM $daemon; wait $daemon || fail "expertd exit $? after SIGTERM"; daemon=
  python3 - "$preset" "$work/stock.bin" "$work/expertd.bin" "$work/stock.txt" "$work/expertd.txt" <<'PY' || rc=1
import array, math, sys
preset, a_path, b_path, a_txt, b_txt = sys.argv[1:]
a, b = array.array("f"), array.array("f")
a.frombytes(open(a_path, "rb").read()); b.frombytes(open(b_path, "rb").read())
tok_a = open(a_txt).readline().strip(); tok_b = open(b_txt).readline().strip()
ok = len(a) == len(b) and len(a) > 0 and all(math.isfinite(x) for x in b)
top = max(abs(x) for x in a) if a else 0.0
diff = max((abs(x - y) for x, y in zip(a, b)), default=float("inf"))
identical = a.tobytes() == b.tobytes()
ok = ok and tok_a == tok_b and diff <= 1e-3 * top
print(f"RESULT llama-gpu {preset}: {len(a)} logits, bitwise {'identical' if identical else 'different'}, "
      f"max |diff| {diff:.3g} (largest logit {top:.3g}), tokens {'equal' if tok_a == tok_b else 'DIFFER'}: "
      f"{'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
done
[ $rc = 0 ] || fail "a preset differed from stock (RESULT lines above)"
echo "PASS"
