// expertctl bench --trace T.jsonl [--addr A] [--sessions N] [--model M] [--gguf F] [--limit N]
//                 [--transport auto|lane|stream] [--no-read] [--json] [--quiet] [--token-file F]
//                 [--timeout S]
// Replays a route trace through the running daemon from N concurrent sessions (one thread and
// one Session each, on one channel). Every session replays the whole trace in access order
// (MakeAccessTrace), session i starting i/N of the way through it (at a token boundary) and
// wrapping around: N engines serving different requests of one model at once, sharing the
// daemon's cache without marching in lockstep. Each (token, layer) group is one Acquire; every
// granted slot is read in full (XXH3 over each projection) and, with --gguf, compared with the
// hash of the same expert's bytes in the model file (--no-read: not read at all, for the
// protocol's own latency); then the lease is released. Latencies are
// of successful calls only: acquire (request to usable lease) and acquire + release (the
// Acquire→Grant→Release cycle without the reading in between).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench_verify.h"
#include "commands.h"
#include "daemon_args.h"
#include "engine/policy_sim.h"
#include "format/route_trace.h"
#include "model_args.h"
#include "progress.h"
#include "util/hash.h"
#include "util/status.h"

namespace expertd::ctl {
namespace {

struct BenchArgs {
  DaemonArgs daemon;
  std::string trace;
  uint32_t sessions = 1;
  std::string model;
  std::string device;  // "" = the model's default device
  std::string gguf;
  uint64_t limit = 0;  // groups per session; 0 = the whole trace
  std::string transport = "auto";
  bool no_read = false;  // protocol latency only: slots are granted and released, not read
  bool json = false;
  bool quiet = false;
};

struct SessionResult {
  uint64_t acquires = 0;
  uint64_t accesses = 0;  // experts requested
  uint64_t granted = 0;   // slots granted
  uint64_t hits = 0;
  uint64_t verified = 0;
  uint64_t mismatches = 0;
  uint64_t errors = 0;
  uint64_t bytes = 0;
  std::vector<double> acquire_us;
  std::vector<double> cycle_us;  // acquire + release
};

// Error lines are capped across all sessions so a broken daemon does not flood the terminal.
class ErrorLog {
 public:
  void Print(const std::string& line) {
    std::lock_guard<std::mutex> lock(mu_);
    if (++printed_ <= 5) std::fprintf(stderr, "expertctl bench: %s\n", line.c_str());
    if (printed_ == 6) std::fprintf(stderr, "expertctl bench: (further errors not shown)\n");
  }

 private:
  std::mutex mu_;
  int printed_ = 0;
};

// Where session `i` of `n` starts: i/n of the way through, moved forward to a token boundary.
size_t StartOffset(const std::vector<RouteRecord>& groups, uint32_t i, uint32_t n) {
  size_t k = groups.size() * i / n;
  if (k == 0) return 0;
  const auto same_token = [&](size_t a, size_t b) {
    return groups[a].problem_id == groups[b].problem_id && groups[a].token == groups[b].token;
  };
  while (k < groups.size() && same_token(k, k - 1)) ++k;
  return k == groups.size() ? 0 : k;
}

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  const size_t idx = std::min(v.size() - 1, rank == 0 ? 0 : rank - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(idx), v.end());
  return v[idx];
}

void ReplaySession(client::Session& session, uint32_t id, const std::vector<RouteRecord>& groups,
                   size_t start, size_t count, const ExpectedHashes* oracle, bool read,
                   std::atomic<uint64_t>* done, ErrorLog* log, SessionResult* out) {
  out->acquire_us.reserve(count);
  uint64_t sink = 0;  // slot hashes without an oracle: the bytes are read all the same
  std::vector<uint8_t> device_copy;  // CUDA sessions: one projection copied back to the host
  for (size_t k = 0; k < count; ++k) {
    const RouteRecord& r = groups[(start + k) % groups.size()];
    ++out->acquires;
    out->accesses += r.experts.size();
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<client::Lease> lease = session.Acquire(r.layer, r.experts);
    const double acquire_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    done->fetch_add(1, std::memory_order_relaxed);
    if (lease.ok()) out->acquire_us.push_back(acquire_us);
    if (!lease.ok()) {
      ++out->errors;
      log->Print(absl::StrCat("session ", id, ": acquire layer ", r.layer, " experts [",
                              absl::StrJoin(r.experts, ","), "]: ", lease.status().message()));
      continue;
    }
    // CUDA sessions: the legacy stream waits for the copies, each slot comes back to the host
    // (ordered after that wait), and done is recorded there before the release.
    const bool cuda = session.info().device_kind() == "cuda";
    if (cuda) {
      if (absl::Status st = session.WaitReady(*lease, nullptr); !st.ok()) {
        ++out->errors;
        log->Print(absl::StrCat("session ", id, ": wait ready: ", st.message()));
        (void)session.Release(*lease);  // never waited for: given back as unread
        continue;
      }
    }
    for (const client::SlotView& s : lease->slots) {
      ++out->granted;
      out->hits += s.hit ? 1 : 0;
      if (!read) continue;
      const std::vector<uint64_t>* want =
          oracle == nullptr ? nullptr : oracle->Find(lease->layer, s.expert);
      const size_t n_proj = cuda ? s.device_projections.size() : s.projections.size();
      bool ok = oracle == nullptr || (want != nullptr && want->size() == n_proj);
      for (size_t p = 0; p < n_proj; ++p) {
        std::span<const uint8_t> bytes;
        if (cuda) {
          absl::StatusOr<client::ArenaRef> arena =
              session.arena(s.slot_class, static_cast<uint32_t>(p));
          absl::Status st = arena.status();
          if (st.ok()) {
            device_copy.resize(arena->stride);
            st = session.CopySlot(s, p, device_copy, nullptr);
          }
          if (!st.ok()) {
            ok = false;
            log->Print(absl::StrCat("session ", id, ": copying slot ", s.slot, ": ",
                                    st.message()));
            continue;
          }
          bytes = device_copy;
        } else {
          bytes = s.projections[p];
        }
        out->bytes += bytes.size();
        const uint64_t h = Xxh3(bytes);
        sink ^= h;
        if (ok && want != nullptr) ok = h == (*want)[p];
      }
      if (oracle == nullptr) continue;
      if (ok) {
        ++out->verified;
      } else {
        ++out->mismatches;
        log->Print(absl::StrCat("session ", id, ": layer ", lease->layer, " expert ", s.expert,
                                " (slot ", s.slot_class, "/", s.slot, " generation ", s.generation,
                                "): content differs from the model file"));
      }
    }
    if (cuda) {
      if (absl::Status st = session.RecordDone(*lease, nullptr); !st.ok()) {
        ++out->errors;
        log->Print(absl::StrCat("session ", id, ": record done: ", st.message()));
      }
    }
    const auto r0 = std::chrono::steady_clock::now();
    if (absl::Status st = session.Release(*lease); !st.ok()) {
      ++out->errors;
      log->Print(absl::StrCat("session ", id, ": release lease ", lease->id, ": ", st.message()));
    } else {
      out->cycle_us.push_back(
          acquire_us +
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - r0).count());
    }
  }
  // Close first: release errors arrive asynchronously, and only the end of the stream says that
  // every one of them has.
  session.Close();
  for (const v1::RequestError& e : session.TakeAsyncErrors()) {
    ++out->errors;
    log->Print(absl::StrCat("session ", id, ": request ", e.seq(), ": ", e.message()));
  }
  for (uint64_t lease : session.TakeExpiredLeases()) {
    ++out->errors;
    log->Print(absl::StrCat("session ", id, ": lease ", lease, " expired while held"));
  }
  if (sink == 1) std::fputc(' ', stderr);  // keeps the hashing observable
}

absl::StatusOr<v1::ModelInfo> ChooseModel(client::Client& c, const std::string& name) {
  ASSIGN_OR_RETURN(const std::vector<v1::ModelInfo> models, c.ListModels());
  std::vector<std::string> names;
  for (const v1::ModelInfo& m : models) {
    if (m.name() == name || (name.empty() && models.size() == 1)) return m;
    names.push_back(m.name());
  }
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the daemon serves ", models.size(), " models (",
                                                   absl::StrJoin(names, ", "),
                                                   "): choose one with --model"));
  }
  return absl::NotFoundError(absl::StrCat("the daemon serves no model '", name,
                                          "' (it serves: ", absl::StrJoin(names, ", "), ")"));
}

absl::Status CheckTrace(const std::string& path, const std::vector<RouteRecord>& groups,
                        const v1::ModelInfo& m, uint32_t max_experts) {
  const std::vector<uint32_t> layers(m.moe_layers().begin(), m.moe_layers().end());
  for (const RouteRecord& r : groups) {
    if (std::find(layers.begin(), layers.end(), r.layer) == layers.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", r.line, ": layer ", r.layer,
                                                     " is not an MoE layer of ", m.name()));
    }
    for (uint32_t e : r.experts) {
      if (e >= m.n_expert()) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ":", r.line, ": expert ", e, " beyond the ", m.n_expert(), " of ", m.name()));
      }
    }
    if (r.experts.empty() || (max_experts > 0 && r.experts.size() > max_experts)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", r.line, ": ", r.experts.size(),
                                                     " experts; the daemon allows 1 to ",
                                                     max_experts, " per acquire"));
    }
  }
  return absl::OkStatus();
}

int RunBench(const BenchArgs& a) {
  const auto fail = [](const absl::Status& st) {
    PrintError("bench", st);
    return 2;
  };
  absl::StatusOr<std::unique_ptr<client::Client>> c = ConnectDaemon(a.daemon);
  if (!c.ok()) return fail(c.status());
  absl::StatusOr<v1::ModelInfo> model = ChooseModel(**c, a.model);
  if (!model.ok()) return fail(model.status());
  absl::StatusOr<std::vector<RouteRecord>> records = ReadRouteTrace(a.trace);
  if (!records.ok()) return fail(records.status());
  absl::StatusOr<AccessTrace> trace = MakeAccessTrace(*std::move(records));
  if (!trace.ok()) return fail(trace.status());
  const std::vector<RouteRecord>& groups = trace->groups;

  // Sessions first: the limits they carry are part of checking the trace.
  std::vector<std::unique_ptr<client::Session>> sessions;
  for (uint32_t i = 0; i < a.sessions; ++i) {
    client::SessionOptions so;
    so.model = model->name();
    so.device = a.device;
    so.client_name = absl::StrCat("expertctl-bench/", i);
    so.transport = a.transport == "lane"     ? client::SessionOptions::Transport::kLane
                   : a.transport == "stream" ? client::SessionOptions::Transport::kStream
                                             : client::SessionOptions::Transport::kAuto;
    absl::StatusOr<std::unique_ptr<client::Session>> s = (*c)->OpenSession(so);
    if (!s.ok()) return fail(s.status());
    sessions.push_back(*std::move(s));
  }
  const std::string device_name = sessions[0]->info().device();
  const std::string transport(sessions[0]->transport());
  if (absl::Status st = CheckTrace(a.trace, groups, *model,
                                   sessions[0]->info().limits().max_experts_per_acquire());
      !st.ok()) {
    return fail(st);
  }
  std::unique_ptr<ExpectedHashes> oracle;
  if (a.no_read && !a.gguf.empty()) {
    return fail(absl::InvalidArgumentError("--no-read and --gguf: nothing read can be verified"));
  }
  if (a.no_read) {
    std::fprintf(stderr, "expertctl bench: --no-read: slots are granted and released, not read\n");
  } else if (a.gguf.empty()) {
    std::fprintf(stderr,
                 "expertctl bench: warning: no --gguf: slot contents are read but not verified\n");
  } else {
    absl::StatusOr<ExpectedHashes> h =
        ExpectedHashes::Build(a.gguf, *model, groups, a.json || a.quiet);
    if (!h.ok()) return fail(h.status());
    oracle = std::make_unique<ExpectedHashes>(*std::move(h));
  }

  const size_t per_session = a.limit > 0 ? std::min<size_t>(a.limit, groups.size()) : groups.size();
  std::vector<SessionResult> results(a.sessions);
  std::atomic<uint64_t> done{0};
  std::atomic<uint32_t> finished{0};
  ErrorLog log;
  Progress progress("bench", per_session * a.sessions, a.json || a.quiet, "acquires");
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < a.sessions; ++i) {
    threads.emplace_back([&, i] {
      ReplaySession(*sessions[i], i, groups, StartOffset(groups, i, a.sessions), per_session,
                    oracle.get(), !a.no_read, &done, &log, &results[i]);
      finished.fetch_add(1);
    });
  }
  while (finished.load() < a.sessions) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    progress.Update(done.load());
  }
  for (std::thread& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.Update(done.load());
  progress.Finish();
  sessions.clear();

  SessionResult all;
  for (SessionResult& r : results) {
    all.acquires += r.acquires;
    all.accesses += r.accesses;
    all.granted += r.granted;
    all.hits += r.hits;
    all.verified += r.verified;
    all.mismatches += r.mismatches;
    all.errors += r.errors;
    all.bytes += r.bytes;
    all.acquire_us.insert(all.acquire_us.end(), r.acquire_us.begin(), r.acquire_us.end());
    all.cycle_us.insert(all.cycle_us.end(), r.cycle_us.begin(), r.cycle_us.end());
  }
  const double hit_rate =
      all.granted ? static_cast<double>(all.hits) / static_cast<double>(all.granted) : 0;
  const double throughput = seconds > 0 ? static_cast<double>(all.bytes) / seconds : 0;
  const double p50 = Percentile(all.acquire_us, 0.50);
  const double p99 = Percentile(all.acquire_us, 0.99);
  const double cycle_p50 = Percentile(all.cycle_us, 0.50);
  const double cycle_p99 = Percentile(all.cycle_us, 0.99);
  if (a.json) {
    std::cout << nlohmann::json{{"accesses", all.accesses},  {"hit_rate", hit_rate},
                                {"verified", all.verified},  {"mismatches", all.mismatches},
                                {"errors", all.errors},      {"acquire_p50_us", p50},
                                {"acquire_p99_us", p99},     {"throughput_bytes_per_s", throughput},
                                {"sessions", a.sessions},    {"seconds", seconds},
                                {"bytes_granted", all.bytes},  {"transport", transport},
                                {"cycle_p50_us", cycle_p50}, {"cycle_p99_us", cycle_p99}}
                     .dump(2)
              << "\n";
  } else {
    std::printf(
        "bench %s on model %s (device %s, %s): %u session(s) x %zu of the trace's %zu acquires, "
        "session i starting i/%u of the way in\n",
        a.trace.c_str(), model->name().c_str(), device_name.c_str(), transport.c_str(),
        a.sessions, per_session,
        groups.size(), a.sessions);
    std::printf(
        "  hit rate    %.3f (%llu of %llu granted slots resident; %llu experts requested)\n",
        hit_rate, static_cast<unsigned long long>(all.hits),
        static_cast<unsigned long long>(all.granted),
        static_cast<unsigned long long>(all.accesses));
    std::printf("  throughput  %s/s (%s of granted slots read in %.2f s)\n",
                HumanBytes(static_cast<uint64_t>(throughput)).c_str(),
                HumanBytes(all.bytes).c_str(), seconds);
    std::printf("  acquire     p50 %.1f us, p99 %.1f us (client side, %llu acquires)\n", p50, p99,
                static_cast<unsigned long long>(all.acquires));
    std::printf("  + release   p50 %.1f us, p99 %.1f us (acquire and release, reading excluded)\n",
                cycle_p50, cycle_p99);
    if (oracle != nullptr) {
      std::printf("  verified    %llu slots against %s, %llu mismatches, %llu errors\n",
                  static_cast<unsigned long long>(all.verified), a.gguf.c_str(),
                  static_cast<unsigned long long>(all.mismatches),
                  static_cast<unsigned long long>(all.errors));
    } else {
      std::printf("  verified    0 slots (no --gguf), %llu errors\n",
                  static_cast<unsigned long long>(all.errors));
    }
  }
  return all.errors == 0 && all.mismatches == 0 ? 0 : 1;
}

}  // namespace

void AddBenchCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "bench",
      "Replay a route trace through the running daemon from N sessions, verify every granted "
      "slot against the model file, and report hit rate, acquire latency and throughput");
  auto a = std::make_shared<BenchArgs>();
  AddDaemonOptions(cmd, &a->daemon);
  cmd->add_option("--trace", a->trace, "Route trace (JSONL)")->required();
  cmd->add_option("--sessions", a->sessions, "Concurrent sessions (one thread each)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  cmd->add_option("--model", a->model, "Served model (default: the only one)");
  cmd->add_option("--device", a->device,
                  "Device the sessions use, e.g. cuda:1 (default: the model's first device)");
  cmd->add_option("--gguf", a->gguf,
                  "The model file the daemon serves (any shard): verify every granted slot");
  cmd->add_option("--limit", a->limit, "Acquires per session (default: the whole trace)");
  cmd->add_option("--transport", a->transport,
                  "Where requests travel: lane (shared memory), stream (gRPC), or auto (the lane "
                  "when the daemon offers one)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "lane", "stream"}));
  cmd->add_flag("--no-read", a->no_read,
                "Do not read granted slots (the protocol's latency alone; not with --gguf)");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->add_flag("--quiet", a->quiet, "No progress output");
  cmd->callback([a, exit_code] { *exit_code = RunBench(*a); });
}

}  // namespace expertd::ctl
