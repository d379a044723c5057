#!/usr/bin/env bash
# Pack files that change under a serving daemon, through the daemon (two models, a and b):
#  1. a's file truncated in place: within 5 s health for a says NOT_SERVING (exit 4) and b's
#     SERVING; the daemon logs it naming the pack; acquires of a that need a read fail with an
#     error naming the file; b keeps serving, every slot verified;
#  2. the file put back: a stays NOT_SERVING until SIGHUP, then serves again, verified;
#  3. the file replaced by a copy (a new inode): noticed, and served again after SIGHUP;
#  4. the file replaced by another model's file: noticed, and SIGHUP refuses to serve it
#     ("another file"); a serves again once the right file is back and SIGHUP is sent;
#  5. the file made unreadable (mode 000): noticed ("can no longer be opened"), acquires fail
#     naming the file; readable again and SIGHUP: served again. Permissions do not stop root, so
#     when the test runs as root the daemon runs as nobody (setpriv);
#  6. SIGTERM: exit 0.
#   daemon_packs.sh EXPERTD EXPERTCTL TRACE
set -euo pipefail
expertd=$1 ctl=$2 trace=$3
work=$(mktemp -d)
daemon=
cleanup() {
  [ -n "$daemon" ] && kill -9 "$daemon" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; tail -30 "$work/daemon.log" 2> /dev/null; exit 1; }

sock=$work/run/expertd.sock
addr=unix://$sock
as_daemon=()
if [ "$(id -u)" = 0 ] && command -v setpriv > /dev/null; then
  # Root reads a mode-000 file anyway: the daemon runs as nobody, root clients allowed.
  as_daemon=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  chmod 755 "$work"
  mkdir -m 750 "$work/run"
  chown 65534:65534 "$work/run"
fi
"$ctl" synth --preset mixtral-tiny --out "$work/a" --seed 1 > /dev/null
"$ctl" synth --preset mixtral-tiny --out "$work/b" --seed 2 > /dev/null
a=$work/a/model.gguf b=$work/b/model.gguf
cp "$a" "$work/a.orig"
cat > "$work/expertd.toml" << EOF
[listen]
allowed_uids = [$(id -u)]
[device]
slot_memory = "6MiB"
[[model]]
name = "a"
gguf = "$a"
[[model]]
name = "b"
gguf = "$b"
EOF

health() {  # health SERVICE: prints the exit code
  local rc=0
  "$ctl" health --addr "$addr" --service "$1" > /dev/null 2>&1 || rc=$?
  echo $rc
}
wait_health() {  # wait_health SERVICE CODE WHAT
  for _ in $(seq 1 50); do
    [ "$(health "$1")" = "$2" ] && return 0
    sleep 0.1
  done
  fail "$3: health of $1 is $(health "$1"), want $2 within 5 s"
}
bench() {  # bench MODEL OUT [args]: prints the exit code
  local model=$1 out=$2 rc=0
  shift 2
  "$ctl" bench --addr "$addr" --model "$model" --trace "$trace" --json --quiet "$@" \
    > "$out.json" 2> "$out.err" || rc=$?
  echo $rc
}
field() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

chmod -R a+rX "$work/a" "$work/b"
"${as_daemon[@]}" "$expertd" --config "$work/expertd.toml" --socket "$sock" > "$work/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 1 240); do
  [ "$(health a)" = 0 ] && break
  kill -0 "$daemon" 2> /dev/null || fail "the daemon exited during start-up"
  sleep 0.25
done
[ "$(health a)" = 0 ] && [ "$(health b)" = 0 ] || fail "the daemon did not serve a and b"
[ "$(bench a "$work/a0" --gguf "$a" --limit 300)" = 0 ] || fail "bench a before any change"

echo "== 1. a truncated in place: a NOT_SERVING, b serving; a's misses fail naming the file"
truncate -s 1M "$a"
wait_health a 4 "after truncation"
[ "$(health b)" = 0 ] || fail "b stopped serving when a's file was truncated"
grep -q "model a on host: pack .*($a): truncated to 1048576 bytes" "$work/daemon.log" ||
  fail "no log line naming the truncated pack"
rc=$(bench a "$work/a1" --limit 600)
[ "$rc" = 1 ] || fail "bench a on a truncated file: exit $rc, want 1"
[ "$(field "$work/a1.json" errors)" -gt 0 ] || fail "no acquire of a failed"
grep -q "$a" "$work/a1.err" && grep -q "truncated" "$work/a1.err" ||
  { cat "$work/a1.err"; fail "the acquire errors do not name the truncated file"; }
[ "$(bench b "$work/b1" --gguf "$b" --limit 600)" = 0 ] || fail "bench b while a is broken"
[ "$(field "$work/b1.json" mismatches)" = 0 ] || fail "b mismatches"
echo "a: $(field "$work/a1.json" errors) of $(field "$work/a1.json" accesses) acquires failed; b: $(field "$work/b1.json" verified) slots verified"

echo "== 2. the file put back: NOT_SERVING until SIGHUP, then serving, every slot verified"
cp "$work/a.orig" "$a"
sleep 1.2
[ "$(health a)" = 4 ] || fail "a serves again before SIGHUP"
kill -HUP "$daemon"
wait_health a 0 "after the file was put back and SIGHUP"
grep -q "SIGHUP: model a on host: pack .*($a): serving again" "$work/daemon.log" ||
  fail "no log line for the pack served again"
[ "$(bench a "$work/a2" --gguf "$a" --limit 600)" = 0 ] || fail "bench a after SIGHUP"
[ "$(field "$work/a2.json" mismatches)" = 0 ] || fail "a mismatches after SIGHUP"

echo "== 3. the file replaced by a copy (new inode): noticed; SIGHUP serves it"
cp "$work/a.orig" "$work/a.new"
mv "$work/a.new" "$a"
wait_health a 4 "after replacement"
grep -q "($a): replaced since it was opened" "$work/daemon.log" || fail "no log line for the replacement"
kill -HUP "$daemon"
wait_health a 0 "after SIGHUP with the same bytes"
[ "$(bench a "$work/a3" --gguf "$a" --limit 300)" = 0 ] || fail "bench a after the replacement"

echo "== 4. the file replaced by another model's: SIGHUP refuses it"
cp "$b" "$work/other"
mv "$work/other" "$a"
wait_health a 4 "after replacement by another model"
kill -HUP "$daemon"
for _ in $(seq 1 50); do
  grep -q "($a): not served again: its first MiB differs from the file served" "$work/daemon.log" && break
  sleep 0.1
done
grep -q "($a): not served again: its first MiB differs" "$work/daemon.log" || fail "SIGHUP did not refuse another model's file"
[ "$(health a)" = 4 ] || fail "a serves another model's file"
cp "$work/a.orig" "$work/a.new"
mv "$work/a.new" "$a"
kill -HUP "$daemon"
wait_health a 0 "after the right file came back"
[ "$(bench a "$work/a4" --gguf "$a" --limit 300)" = 0 ] || fail "bench a at the end"

echo "== 5. the file made unreadable: noticed, acquires fail naming it; readable + SIGHUP: served"
chmod 000 "$a"
wait_health a 4 "after chmod 000"
grep -q "($a): can no longer be opened" "$work/daemon.log" || fail "no log line for the unreadable pack"
rc=$(bench a "$work/a5" --limit 600)
[ "$rc" = 1 ] || fail "bench a on an unreadable file: exit $rc, want 1"
grep -q "($a): can no longer be opened" "$work/a5.err" ||
  { cat "$work/a5.err"; fail "the acquire errors do not name the unreadable file"; }
[ "$(health b)" = 0 ] || fail "b stopped serving when a's file became unreadable"
chmod 644 "$a"
kill -HUP "$daemon"
wait_health a 0 "after the file was readable again and SIGHUP"
[ "$(bench a "$work/a6" --gguf "$a" --limit 300)" = 0 ] || fail "bench a after chmod back"
echo "a: $(field "$work/a5.json" errors) of $(field "$work/a5.json" accesses) acquires failed while unreadable"

echo "== 6. SIGTERM"
kill -TERM "$daemon"
rc=0; wait "$daemon" || rc=$?
daemon=
[ $rc -eq 0 ] || fail "daemon exit $rc after SIGTERM"
echo "PASS"
