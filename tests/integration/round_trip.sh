#!/usr/bin/env bash
# Round trip for one synth preset through the real expertctl binary:
#   synth -> inspect --json -> index build (each placement, with and without --bundle)
#   -> index verify --content,
# then the failure paths: a corrupted Q byte and a truncated Q pack must make verify exit 1
# naming the index line, and a v1 parity index must verify with --v1-q-pack.
#   round_trip.sh EXPERTCTL PRESET TRACE_OR_-
set -euo pipefail
ctl=$1 preset=$2 trace=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$ctl" synth --preset "$preset" --out "$work/m" --seed 11 --quiet >/dev/null
model="$work/m/model.gguf"
"$ctl" inspect "$model" --json > "$work/inspect.json"

# The JSON must hold the documented keys; the MoE summary must match the preset's model family.
python3 - "$work/inspect.json" "$preset" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); preset = sys.argv[2]
for k in ("version", "alignment", "data_offset", "kv_count", "tensor_count", "tensors", "moe"):
    assert k in j, f"inspect --json lacks {k}"
assert j["version"] == 3 and j["tensor_count"] == len(j["tensors"])
for t in j["tensors"]:
    assert set(("name", "type", "ne", "offset", "nbytes")) <= set(t), t
    assert t["offset"] % j["alignment"] == 0 and t["offset"] >= j["data_offset"]
want = {"mixtral-tiny": (8, 2, 32), "mixtral-legacy-tiny": (8, 2, None),
        "deepseek-tiny": (256, 8, None), "qwen3moe-tiny": (128, 8, None),
        "gptoss-tiny": (32, 4, None)}[preset]
m = j["moe"]
assert m is not None, "no MoE summary"
assert (m["n_expert"], m["n_expert_used"]) == want[:2], m
if want[2] is not None:
    assert m["layers"] == want[2], m["layers"]
# Every expert byte of the model is counted once: the sum over expert tensors' sizes.
stacked = sum(t["nbytes"] for t in j["tensors"]
              if "_exps." in t["name"] or (".ffn_" in t["name"] and t["name"].split(".")[3].isdigit()))
assert m["expert_bytes_total"] == stacked, (m["expert_bytes_total"], stacked)
PY

if [ "$trace" = - ]; then
  # Generate a skewed trace over the model's MoE layers for the hot placement.
  trace="$work/trace.jsonl"
  python3 - "$work/inspect.json" "$trace" <<'PY'
import json, random, sys
m = json.load(open(sys.argv[1]))["moe"]
rng = random.Random(5)
weights = [1.0 / (e + 1) for e in range(m["n_expert"])]
with open(sys.argv[2], "w") as out:
    for token in range(40):
        for layer in m["layer_blocks"]:
            chosen = set()
            while len(chosen) < m["n_expert_used"]:
                chosen.add(rng.choices(range(m["n_expert"]), weights)[0])
            out.write(json.dumps({"token": token, "layer": layer, "experts": sorted(chosen)}) + "\n")
PY
fi

for placement in parity all none "hot:$trace:0.3"; do
  for bundle in "" --bundle; do
    name="$work/q-${placement%%:*}${bundle}"
    "$ctl" index build --gguf "$model" --out "$name.idx" --q-pack "$name.qpack" \
      --placement "$placement" $bundle --quiet > /dev/null
    "$ctl" index verify "$name.idx" --gguf "$model" --content --quiet > "$name.verify" ||
      { cat "$name.verify"; fail "verify of $placement $bundle"; }
    grep -q '^OK$' "$name.verify" || fail "verify printed no OK for $placement $bundle"
  done
done

# Row counts follow from the placement: all = every (layer, expert, projection). The expected
# count comes from the file itself, read by an independent GGUF reader (tests/support): each
# stacked expert tensor (blk.N.ffn_*_exps.weight/.bias) holds expert_count experts, each
# pre-2024 per-expert tensor (blk.N.ffn_{gate,up,down}.E.weight) one.
rows_all=$(grep -vc '^[#@]' "$work/q-all.idx")
want_rows=$(python3 "$(dirname "$0")/../support/gguf_tensors.py" "$model" | python3 -c '
import json, re, sys
j = json.load(sys.stdin); md = j["metadata"]
n = md[md["general.architecture"] + ".expert_count"]
rows = 0
for t in j["tensors"]:
    if re.fullmatch(r"blk\.\d+\.ffn_\w+_exps\.(weight|bias)", t["name"]):
        rows += n
    elif re.fullmatch(r"blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight", t["name"]):
        rows += 1
print(rows)')
[ "$rows_all" = "$want_rows" ] || fail "placement all wrote $rows_all rows, expected $want_rows"
[ "$(grep -vc '^[#@]' "$work/q-none.idx")" = 0 ] || fail "placement none wrote rows"

# A corrupted byte in the Q pack: verify --content must fail and name an index line.
cp "$work/q-all--bundle.qpack" "$work/bad.qpack"
sed "s|q-all--bundle.qpack|bad.qpack|" "$work/q-all--bundle.idx" > "$work/bad.idx"
row=$(grep -vn '^[#@]' "$work/bad.idx" | sed -n '5p')
line=${row%%:*}
offset=$(echo "$row" | cut -f4)
printf '\xff' | dd of="$work/bad.qpack" bs=1 seek="$offset" conv=notrunc status=none
cmp -s "$work/bad.qpack" "$work/q-all--bundle.qpack" && printf '\x00' |
  dd of="$work/bad.qpack" bs=1 seek="$offset" conv=notrunc status=none
if "$ctl" index verify "$work/bad.idx" --gguf "$model" --content --quiet > "$work/bad.out"; then
  fail "verify accepted a corrupted Q pack"
fi
grep -q "bad.idx:$line: .*differs" "$work/bad.out" || { cat "$work/bad.out"; fail "no line $line"; }

# A truncated Q pack: rows past the end fail the bounds check (exit 1, not a crash).
truncate -s 4096 "$work/bad.qpack"
rc=0; "$ctl" index verify "$work/bad.idx" --gguf "$model" --quiet > "$work/trunc.out" || rc=$?
[ "$rc" = 1 ] || fail "truncated pack: exit $rc, expected 1"
grep -q "lies outside" "$work/trunc.out" || fail "truncated pack: no bounds failure"

# A split model: any shard shows the whole model, and the index tools take shards.
"$ctl" synth --preset "$preset" --out "$work/s" --seed 11 --split 3 --quiet >/dev/null
shard() { printf '%s/s/model-%05d-of-00003.gguf' "$work" "$1"; }
for k in 1 2 3; do
  n=$("$ctl" inspect "$(shard $k)" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['tensor_count'])")
  want=$(python3 -c "import json; print(json.load(open('$work/inspect.json'))['tensor_count'])")
  [ "$n" = "$want" ] || fail "shard $k shows $n tensors, the model has $want"
done
"$ctl" index build --gguf "$(shard 3)" --out "$work/split.idx" --q-pack "$work/split.qpack" \
  --placement all --bundle --quiet > /dev/null
"$ctl" index verify "$work/split.idx" --gguf "$(shard 1)" --gguf "$(shard 2)" --content --quiet \
  > "$work/split.out" || { cat "$work/split.out"; fail "verify of the split model"; }
cmp -s "$work/split.qpack" "$work/q-all--bundle.qpack" || fail "split and single-file Q packs differ"

# The origin's v1 format for the parity layout.
"$ctl" index build --gguf "$model" --out "$work/v1.idx" --q-pack "$work/v1.qpack" \
  --placement parity --format v1 --quiet > /dev/null
"$ctl" index verify "$work/v1.idx" --gguf "$model" --v1-q-pack "$work/v1.qpack" --content \
  --quiet > "$work/v1.out" || { cat "$work/v1.out"; fail "v1 verify"; }
rc=0; "$ctl" index verify "$work/v1.idx" --gguf "$model" --quiet > /dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "v1 index without --v1-q-pack: exit $rc, expected 2"
echo "round trip $preset: OK"
