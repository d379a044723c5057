#!/usr/bin/python3
"""The daemon under a fake service manager: a NOTIFY_SOCKET datagram socket records what expertd
sends. Checks that READY=1 is sent only after the model loaded and the listeners are up
(health answers SERVING at that point), STATUS= lines, WATCHDOG=1 pings at half of
WATCHDOG_USEC, RELOADING=1 on SIGHUP (log level, policy and predictor
reloaded from the edited file), STOPPING=1 on SIGTERM and exit 0.

  daemon_notify.py EXPERTD RAW_RPC
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def main():
    expertd, raw = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as work:
        notify_path = os.path.join(work, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(notify_path)
        sock.settimeout(0.2)
        env = dict(os.environ, NOTIFY_SOCKET=notify_path, WATCHDOG_USEC="400000",
                   XDG_CACHE_HOME=os.path.join(work, "cache"))
        env.pop("WATCHDOG_PID", None)
        daemon_sock = os.path.join(work, "run", "expertd.sock")
        config = os.path.join(work, "expertd.toml")
        with open(config, "w") as f:
            f.write('[logging]\nlevel = "info"\n')
        log = open(os.path.join(work, "daemon.log"), "w")
        proc = subprocess.Popen([expertd, "--demo", "--config", config, "--socket", daemon_sock],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        messages = []
        ready_at = None

        def pump_until(done, seconds):
            """Records messages until done() holds; False after `seconds` (a bound on a hang,
            far above what a loaded machine needs)."""
            end = time.time() + seconds
            while not done():
                if time.time() > end:
                    return False
                try:
                    data = sock.recv(4096).decode()
                except socket.timeout:
                    continue
                messages.append((time.time(), data))
            return True

        def daemon_log():
            log.flush()
            return open(os.path.join(work, "daemon.log")).read()

        try:
            pump_until(lambda: any("READY=1" in m for _, m in messages), 60)
            ready = [t for t, m in messages if "READY=1" in m]
            assert ready, f"no READY=1; got {messages}"
            ready_at = ready[0]
            health = subprocess.run([raw, "unix://" + daemon_sock, "health"], capture_output=True,
                                    text=True).stdout.strip()
            assert health == "SERVING", f"health after READY=1: {health}"
            statuses = [m for _, m in messages if m.startswith("STATUS=")]
            assert any("loading model demo" in m for m in statuses), statuses
            ready_msg = [m for _, m in messages if "READY=1" in m][0]
            assert "STATUS=serving demo" in ready_msg, ready_msg
            # WATCHDOG=1 at half of WATCHDOG_USEC (0.4 s): wait for 6 pings, however long a
            # loaded machine takes, then check their spacing by its median, which a few late
            # wake-ups do not move. systemd's limit is the full WATCHDOG_USEC.
            def pings():
                return [t for t, m in messages if m == "WATCHDOG=1" and t > ready_at]
            assert pump_until(lambda: len(pings()) >= 6, 30), \
                f"{len(pings())} watchdog pings in 30 s at WATCHDOG_USEC=0.4 s"
            gaps = sorted(b - a for a, b in zip(pings(), pings()[1:]))
            median_gap = gaps[len(gaps) // 2]
            assert median_gap < 0.4, f"watchdog pings every {median_gap:.3f} s (median), limit 0.4 s"
            with open(config, "w") as f:
                f.write('[logging]\nlevel = "debug"\n[cache]\npolicy = "lru"\n'
                        '[predictor]\nkind = "none"\n')
            proc.send_signal(signal.SIGHUP)
            assert pump_until(lambda: any(m.startswith("RELOADING=1") for _, m in messages), 30), \
                "no RELOADING=1"
            # The reload is logged after RELOADING=1; wait for those lines, not for a time.
            end = time.time() + 30
            while time.time() < end and "cache.policy = lru, predictor = none" not in daemon_log():
                time.sleep(0.05)
            text = daemon_log()
            assert "logging.level = debug" in text, "log level not reloaded"
            assert "cache.policy = lru, predictor = none" in text, "policy/predictor not reloaded"
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
            assert pump_until(lambda: any(m.startswith("STOPPING=1") for _, m in messages), 5), \
                "no STOPPING=1"
            assert rc == 0, f"exit code {rc}"
            print(f"READY=1 after {len(statuses)} STATUS lines; watchdog pings every "
                  f"{median_gap:.3f} s (median of {len(gaps)}); RELOADING=1, STOPPING=1, exit 0")
        except AssertionError as e:
            print("FAIL:", e)
            print(daemon_log()[-3000:])
            return 1
        finally:
            if proc.poll() is None:
                proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
