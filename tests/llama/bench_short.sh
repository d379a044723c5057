#!/usr/bin/env bash
# The short version of bench/llama_bench.sh (scale 1, 16-token prompt, 8 steps, 2 reps): it runs
# every configuration, its logits agree (no warning), the expertd runs report their ops, and the
# engine's private memory without the experts is smaller than stock's by most of their bytes.
source "$(dirname "$0")/llama_env.sh"
LLAMA_OUT=$llama_out "$root/bench/llama_bench.sh" --scale 1 --prompt 16 --steps 8 --reps 2 \
  > "$work/table.md" 2> "$work/bench.err" || { cat "$work/bench.err"; fail "llama_bench.sh"; }
cat "$work/table.md"
grep -q WARNING "$work/bench.err" && { cat "$work/bench.err"; fail "the bench's runs disagree"; }
python3 - "$work/table.md" "$root/build/bench-cache/mixtral-tiny-x1/model.gguf" "$root/build/bin/expertctl" <<'PY' || fail "the table"
import json, subprocess, sys
table, model, expertctl = sys.argv[1:]
rows = {}
for line in open(table):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 9 and cells[0] not in ("run",) and not cells[0].startswith("-"):
        rows[cells[0]] = cells
want = ["stock", "stock-norepack", "stock-norepack-nommap", "expertd-full", "expertd-norepack",
        "expertd-norepack-asked", "expertd-quarter", "stock-norepack-poll0", "expertd-norepack-poll0"]
missing = [n for n in want if n not in rows]
assert not missing, f"rows missing: {missing}"
for n in want:
    float(rows[n][2]); assert float(rows[n][2]) > 0, f"{n}: decode tokens/s {rows[n][2]}"
    ops = rows[n][8]
    if n.startswith("expertd"):
        acq, rel, wake = [p.strip() for p in ops.split(",")]
        assert float(acq.split("/")[0]) > 0, f"{n}: no acquire op time ({ops})"
    else:
        assert ops == "-", f"{n}: ops {ops}"
expert_mib = json.loads(subprocess.run([expertctl, "inspect", model, "--json"], check=True,
                                       capture_output=True, text=True).stdout)["moe"]["expert_bytes_total"] / 2**20
saved = int(rows["stock-norepack"][5]) - int(rows["expertd-norepack"][5])
assert saved >= 0.8 * expert_mib, f"private memory drops by {saved} MiB, the experts are {expert_mib:.0f} MiB"
print(f"PASS: {len(want)} configurations, 2 reps; private memory {saved} MiB below stock's ({expert_mib:.0f} MiB of experts)")
PY
