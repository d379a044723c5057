#!/usr/bin/env bash
# expertctl replay with a model: the real engine reads the packs (each read method), fills the
# slots and verifies every granted bundle; the real Mixtral trace replays against mixtral-tiny.
#   replay_model.sh EXPERTCTL TRACE [METHOD:PREDICTOR:CAPACITY ...]
# Without runs: pread/none, pread/history, mmap/none, then the corrupted-pack check. A run whose
# packs fell back to another read method (direct on a file system without O_DIRECT) tested that
# other method: the script then exits 77 (skipped) with the reason.
set -euo pipefail
ctl=$1 trace=$2
shift 2
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(pread:none:48 pread:history:128 mmap:none:48)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$ctl" synth --preset mixtral-tiny --out "$work/m" --seed 3 --quiet > /dev/null
# The first 30 tokens of the first problem: every layer, 960 records.
python3 - "$trace" "$work/trace.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tok = lambda r: r.get("token", r.get("token_idx", r.get("token_pos")))
keep = [r for r in rows if r.get("problem_id", 0) == rows[0].get("problem_id", 0) and tok(r) < 30]
open(sys.argv[2], "w").writelines(json.dumps(r) + "\n" for r in keep)
assert len(keep) == 960, len(keep)
PY
# A prefetch may only evict what the current sweep has not used, so the history predictor gets
# a pool larger than one sweep (64 bundles).
for run in "${runs[@]}"; do
  IFS=: read -r method predictor capacity <<< "$run"
  for _ in once; do
    "$ctl" replay --trace "$work/trace.jsonl" --model "$work/m" --capacity "$capacity" --policy cycle \
      --predictor "$predictor" --read-method "$method" --json > "$work/out.json" ||
      { cat "$work/out.json"; fail "replay with $method/$predictor"; }
    rc=0
    python3 - "$work/out.json" "$method" <<'PY' || rc=$?
import json, sys
j = json.load(open(sys.argv[1])); method = sys.argv[2]
fell = [p for p in j["pack_methods"] if p["method"] != method]
for p in fell:
    print(f"SKIP: {method} fell back to {p['method']} for pack {p['pack']}: {p['note']}")
sys.exit(3 if fell else 0)
PY
    [ $rc != 3 ] || exit 77
    [ $rc = 0 ] || fail "reading the replay's pack methods"
    python3 - "$work/out.json" "$method" "$predictor" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); method, predictor = sys.argv[2:]
# 960 records of a top-2 trace: 1920 accesses, every one granted and verified.
assert j["accesses"] == 1920, j["accesses"]
assert j["verified"] == 1920 and j["mismatches"] == 0 and j["errors"] == 0, j
assert 0 < j["hits"] < j["accesses"], j
# Every fill reads its bundle once and copies it once (prefetches may still be between their read
# and their copy when the replay reports).
assert j["bytes_copied"] > 0, j
if predictor == "none":
    assert j["bytes_read"] == j["bytes_copied"], j
else:
    assert j["bytes_read"] >= j["bytes_copied"], j
if predictor == "history":
    assert j["prefetch_issued"] > 0, j
else:
    assert j["prefetch_issued"] == 0, j
PY
    echo "replay $method/$predictor/$capacity: verified, every pack read with $method"
  done
done
[ $# -eq 0 ] || { echo "replay with a model: OK"; exit 0; }
# A corrupted Q copy is caught: place all experts in a Q pack, flip a byte, replay with the index.
"$ctl" index build --gguf "$work/m/model.gguf" --out "$work/q.idx" --q-pack "$work/q.pack" \
  --placement all --bundle --quiet > /dev/null
# One awk over the file: a grep piped into an awk that exits early dies of SIGPIPE (pipefail).
offset=$(awk -F'\t' '!/^[#@]/ && $1 == "blk.0.ffn_up_exps.weight" {print $4; exit}' "$work/q.idx")
printf '\xAA' | dd of="$work/q.pack" bs=1 seek="$offset" conv=notrunc status=none
rc=0
"$ctl" replay --trace "$work/trace.jsonl" --model "$work/m" --index "$work/q.idx" --capacity 48 \
  --policy lru --json > "$work/bad.json" || rc=$?
[ "$rc" = 1 ] || fail "replay over a corrupted pack exited $rc, expected 1"
python3 -c "import json; j = json.load(open('$work/bad.json')); assert j['mismatches'] > 0, j"
echo "replay with a model: OK"
