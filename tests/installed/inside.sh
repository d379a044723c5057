#!/bin/sh
# Runs inside the booted Debian root of scripts/test-installed, as a oneshot unit after
# multi-user.target: checks the installed expertd package under its real systemd unit and the
# installed SDK (a program built against it with pkg-config and with find_package), writes
# one line per check to /root/installed-result.txt (PASS/FAIL/INFO), then powers the machine off.
out=/root/installed-result.txt
: > $out
say() { echo "$*" >> $out; }
check() {  # check NAME COMMAND...: PASS when COMMAND succeeds
  name=$1; shift
  if "$@" >> /root/installed-detail.txt 2>&1; then say "PASS $name"; else say "FAIL $name"; fi
}
main_pid() { systemctl show -p MainPID --value expertd; }
sock=unix:///run/expertd/expertd.sock

# A synthetic model and a config serving it.
mkdir -p /srv/models
expertctl synth --preset mixtral-tiny --out /srv/models/tiny --quiet >> /root/installed-detail.txt 2>&1
cat >> /etc/expertd/expertd.toml <<TOML

[[model]]
name = "tiny"
gguf = "/srv/models/tiny/model.gguf"
TOML
sed -i 's/^kind = "auto"/kind = "host"/; s/^slot_memory = .*/slot_memory = "64MiB"/' /etc/expertd/expertd.toml
useradd -m -G expertd alice 2>/dev/null
useradd -m bob 2>/dev/null

check start systemctl start expertd
check ready sh -c '[ "$(systemctl show -p ActiveState --value expertd)" = active ]'
say "INFO status: $(systemctl show -p StatusText --value expertd)"
check health_as_group_member runuser -u alice -- expertctl health --addr $sock --service tiny
if runuser -u bob -- expertctl health --addr $sock --service tiny > /dev/null 2>&1; then
  say "FAIL health_refused_to_others"
else
  say "PASS health_refused_to_others"
fi

sed -i 's/^policy = "cycle"/policy = "lru"/' /etc/expertd/expertd.toml
check reload systemctl reload expertd
sleep 2
check reload_applied sh -c 'journalctl -u expertd --no-pager | grep -q "cache.policy = lru"'

pid=$(main_pid)
say "INFO watchdog: waiting 40 s (WatchdogSec=30) with pid $pid"
sleep 40
check watchdog_kept_alive sh -c "[ \"\$(systemctl show -p MainPID --value expertd)\" = $pid ] && systemctl is-active -q expertd"

check stop systemctl stop expertd
check stop_exit_0 sh -c '[ "$(systemctl show -p ExecMainStatus --value expertd)" = 0 ]'

systemctl start expertd
pid=$(main_pid)
kill -9 "$pid"
sleep 6
new=$(main_pid)
check restarted_after_kill sh -c "[ -n \"$new\" ] && [ \"$new\" != 0 ] && [ \"$new\" != $pid ] && systemctl is-active -q expertd"
check no_shared_memory_left sh -c '! ls /dev/shm | grep -q expertd'
say "INFO /dev/shm: $(ls /dev/shm | tr '\n' ' ')"

# Hardening: any directive systemd could not apply shows in the journal.
journalctl -u expertd --no-pager > /root/installed-journal.txt 2>&1
if grep -qiE 'Failed to (set up|apply)|Operation not permitted|EPERM|status=2[0-9][0-9]/' /root/installed-journal.txt; then
  say "FAIL hardening: see installed-journal.txt"
else
  say "PASS hardening_applied"
fi
systemctl stop expertd

# The SDK as an engine finds it: the C API's test program built against the installed
# libexpertd-client-dev only, run against the installed expertd (--daemon starts its demo).
sdk=/root/sdk
check sdk_pkgconfig sh -c "cc -std=c99 -Wall -DEXPERTD_SOURCE_DIR='\"$sdk\"' \
  $sdk/tests/unit/client_c_api_test.c \$(pkg-config --cflags --libs expertd-client) \
  -o /root/c_test_pkgconfig && /root/c_test_pkgconfig --daemon /usr/bin/expertd"
check sdk_find_package sh -c "cmake -S $sdk/tests/install -B /root/consumer \
  -DEXPERTD_C_TEST_SOURCE=$sdk/tests/unit/client_c_api_test.c -DEXPERTD_SOURCE_DIR=$sdk && \
  cmake --build /root/consumer && /root/consumer/sdk_c_test --daemon /usr/bin/expertd"
say "INFO sdk: $(pkg-config --modversion expertd-client 2>&1), $(tail -1 /root/installed-detail.txt)"
say "DONE"
systemctl poweroff
