// expertctl stats [--addr A] [--model M] [--watch [--interval S]] [--json]
// The daemon's counters (GetStats): per model hits, misses, joins, hit rate, bytes read per pack,
// bytes copied, stall percentiles; per live session its transport (lane or stream), acquires,
// hits, misses, errors, leases, acquire percentiles and, for lane sessions, the lane's counters.
// --watch polls until interrupted: a redrawn screen on a terminal, plain repeated blocks
// otherwise; with --json one compact object per poll and line.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "commands.h"
#include "daemon_args.h"
#include "model_args.h"
#include "progress.h"

namespace expertd::ctl {
namespace {

struct StatsArgs {
  DaemonArgs daemon;
  std::string model;
  bool watch = false;
  double interval_s = 2;
  bool json = false;
};

double HitRate(const v1::ModelStats& m) {
  return m.accesses() ? static_cast<double>(m.hits()) / static_cast<double>(m.accesses()) : 0;
}

nlohmann::json StatsJson(const v1::GetStatsResponse& r) {
  nlohmann::json models = nlohmann::json::array();
  for (const v1::ModelStats& m : r.models()) {
    nlohmann::json packs = nlohmann::json::object();
    for (const v1::ByteCount& b : m.pack_bytes_read()) packs[b.name()] = b.bytes();
    nlohmann::json groups = nlohmann::json::object();
    for (const v1::ByteCount& b : m.group_bytes_read()) groups[b.name()] = b.bytes();
    nlohmann::json sessions = nlohmann::json::array();
    for (const v1::SessionStats& s : m.sessions()) {
      sessions.push_back({{"session", s.session()},
                          {"client_name", s.client_name()},
                          {"client_pid", s.client_pid()},
                          {"acquires", s.acquires()},
                          {"hits", s.hits()},
                          {"misses", s.misses()},
                          {"errors", s.errors()},
                          {"leases_held", s.leases_held()},
                          {"acquire_p50_us", s.acquire_p50_us()},
                          {"acquire_p99_us", s.acquire_p99_us()},
                          {"transport", s.transport()}});
      if (s.transport() == "lane") {
        sessions.back()["lane"] = {{"requests", s.lane().requests()},
                                   {"responses", s.lane().responses()},
                                   {"bytes_in", s.lane().bytes_in()},
                                   {"bytes_out", s.lane().bytes_out()},
                                   {"daemon_sleeps", s.lane().daemon_sleeps()},
                                   {"client_wakes", s.lane().client_wakes()},
                                   {"deferred", s.lane().deferred()},
                                   {"client_hits", s.lane().client_hits()}};
      }
    }
    models.push_back({{"model", m.model()},
                      {"device", m.device()},
                      {"accesses", m.accesses()},
                      {"hits", m.hits()},
                      {"joins", m.joins()},
                      {"misses", m.misses()},
                      {"hit_rate", HitRate(m)},
                      {"evictions", m.evictions()},
                      {"client_hits", m.client_hits()},
                      {"pinned_skips", m.pinned_skips()},
                      {"prefetch_issued", m.prefetch_issued()},
                      {"prefetch_used", m.prefetch_used()},
                      {"prefetch_wasted", m.prefetch_wasted()},
                      {"prefetch_dropped", m.prefetch_dropped()},
                      {"bytes_read", m.bytes_read()},
                      {"pack_bytes_read", packs},
                      {"group_bytes_read", groups},
                      {"bytes_copied", m.bytes_copied()},
                      {"bytes_direct", m.bytes_direct()},
                      {"fills_failed", m.fills_failed()},
                      {"stall_p50_us", m.stall_p50_us()},
                      {"stall_p99_us", m.stall_p99_us()},
                      {"sessions", sessions}});
  }
  return {{"device", r.device()},
          {"uptime_ms", r.uptime_ms()},
          {"draining", r.draining()},
          {"sessions", r.sessions()},
          {"leases_outstanding", r.leases_outstanding()},
          {"models", models}};
}

std::string StatsText(const v1::GetStatsResponse& r) {
  std::string out;
  absl::StrAppendFormat(&out, "expertd: device %s, up %.1f s, %u session(s)%s\n",
                        absl::StrJoin(r.devices(), ", "),
                        static_cast<double>(r.uptime_ms()) / 1000, r.sessions(),
                        r.draining() ? ", draining" : "");
  for (const v1::ModelStats& m : r.models()) {
    absl::StrAppendFormat(&out, "\nmodel %s on %s\n", m.model(), m.device());
    absl::StrAppendFormat(
        &out, "  accesses %d: hits %d, joins %d, misses %d, hit rate %.3f, evictions %d\n",
        m.accesses(), m.hits(), m.joins(), m.misses(), HitRate(m), m.evictions());
    if (m.client_hits() > 0 || m.pinned_skips() > 0) {
      absl::StrAppendFormat(&out,
                            "  client-side hits %d (served in the clients' processes); victims "
                            "skipped for a client's pin %d\n",
                            m.client_hits(), m.pinned_skips());
    }
    std::string packs;
    for (const v1::ByteCount& b : m.pack_bytes_read()) {
      absl::StrAppendFormat(&packs, "%s%s %s", packs.empty() ? "" : ", ", b.name(),
                            HumanBytes(b.bytes()));
    }
    absl::StrAppendFormat(&out, "  read %s%s, copied %s%s, fills failed %d\n",
                          HumanBytes(m.bytes_read()), packs.empty() ? "" : " (" + packs + ")",
                          HumanBytes(m.bytes_copied()),
                          m.bytes_direct() > 0
                              ? absl::StrCat(" (", HumanBytes(m.bytes_direct()), " direct)")
                              : std::string(),
                          m.fills_failed());
    absl::StrAppendFormat(
        &out,
        "  stall p50 %.1f us, p99 %.1f us; prefetch issued %d, used %d, wasted %d, dropped %d\n",
        m.stall_p50_us(), m.stall_p99_us(), m.prefetch_issued(), m.prefetch_used(),
        m.prefetch_wasted(), m.prefetch_dropped());
    if (m.sessions().empty()) {
      out += "  no sessions\n";
      continue;
    }
    absl::StrAppendFormat(&out, "  %-8s %-24s %8s %-6s %9s %9s %9s %6s %6s %10s %10s\n",
                          "session", "name", "pid", "via", "acquires", "hits", "misses", "errors",
                          "leases", "p50 us", "p99 us");
    for (const v1::SessionStats& s : m.sessions()) {
      absl::StrAppendFormat(&out, "  %-8s %-24.24s %8d %-6s %9d %9d %9d %6d %6d %10.1f %10.1f\n",
                            s.session(), s.client_name().empty() ? "-" : s.client_name(),
                            s.client_pid(), s.transport(), s.acquires(), s.hits(), s.misses(),
                            s.errors(), s.leases_held(), s.acquire_p50_us(), s.acquire_p99_us());
      if (s.transport() == "lane") {
        absl::StrAppendFormat(&out,
                              "  %-8s lane: %d requests, %d answers (%d deferred), lane thread "
                              "slept %d times, %d client wakes\n",
                              "", s.lane().requests(), s.lane().responses(), s.lane().deferred(),
                              s.lane().daemon_sleeps(), s.lane().client_wakes());
      }
    }
  }
  return out;
}

std::atomic<bool> g_interrupted{false};

void OnInterrupt(int) { g_interrupted.store(true); }

// Sleeps `seconds` in short steps; false when interrupted meanwhile.
bool SleepUnlessInterrupted(double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (g_interrupted.load()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return !g_interrupted.load();
}

int RunStats(const StatsArgs& a) {
  absl::StatusOr<std::unique_ptr<client::Client>> c = ConnectDaemon(a.daemon);
  if (!c.ok()) {
    PrintError("stats", c.status());
    return 2;
  }
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  if (a.watch) {
    // Ctrl-C ends the watch normally (exit 0) instead of killing the process mid-line.
    struct sigaction sa {};
    sa.sa_handler = OnInterrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  }
  for (bool first = true;; first = false) {
    const absl::StatusOr<v1::GetStatsResponse> r = (*c)->GetStats(a.model);
    if (!r.ok()) {
      PrintError("stats", r.status());
      return 2;
    }
    if (a.json) {
      std::cout << (a.watch ? StatsJson(*r).dump() : StatsJson(*r).dump(2)) << std::endl;
    } else if (a.watch && tty) {
      std::cout << "\033[H\033[J" << StatsText(*r) << "\n(every " << a.interval_s
                << " s; Ctrl-C ends)" << std::flush;
    } else {
      if (a.watch) {
        const std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        char stamp[32];
        std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &local);
        std::cout << (first ? "" : "\n") << "== " << stamp << "\n";
      }
      std::cout << StatsText(*r) << std::flush;
    }
    if (!a.watch || !SleepUnlessInterrupted(a.interval_s)) break;
  }
  if (a.watch && tty && !a.json) std::cout << "\n";
  return 0;
}

}  // namespace

void AddStatsCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("stats",
                                 "Show the daemon's counters per model and per session (GetStats)");
  auto a = std::make_shared<StatsArgs>();
  AddDaemonOptions(cmd, &a->daemon);
  cmd->add_option("--model", a->model, "Only this model (default: every model)");
  auto* watch = cmd->add_flag("--watch", a->watch, "Poll until interrupted");
  cmd->add_option("--interval", a->interval_s, "Seconds between polls with --watch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->needs(watch);
  cmd->add_flag("--json", a->json, "Print JSON (with --watch: one object per poll and line)");
  cmd->callback([a, exit_code] { *exit_code = RunStats(*a); });
}

}  // namespace expertd::ctl
