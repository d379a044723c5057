// Host streaming throughput against the memcpy limit (docs/performance.md, "Host streaming").
//
// Synthesizes a model (default: mixtral-tiny at --scale 8, bundles of about 1 MiB) split into
// two GGUF shards, reads the shards once so they sit in the page cache, then runs the real
// engine on the host device: --sessions threads acquire and release bundles as clients would
// (signal done, release), each sweeping the layers with its own experts (starting at evenly
// spread layers), through a pool smaller than the working set under LRU, so every acquire
// misses (the hit and join counts printed prove it). Reported: bundle bytes granted per second, and
// single-thread memcpy of the same number of bytes in bundle-sized pieces (from a buffer the size
// of the model's experts into one the size of the pool, best of 3) measured in the same run, and
// their ratio.
//
// Configurations, each after one untimed warm-up sweep:
//   in place        the default: readers pread straight into the slots (one copy per byte)
//   staging + copy  fill_in_place off: pread into staging, then a copy thread memcpy's into
//                   the slot (two copies per byte)
//   1 group x 1     both shards in one source group read by one thread
//   2 groups x 1    one shard per source group, one thread each: per-group bytes, and the share
//                   of 1 ms intervals in which both groups started reads
//   ..., drive 0.5 ms  the same two with a simulated slow drive (every read attempt sleeps
//                   0.5 ms first, through the packs' test hook): two drives' worth of waiting
//                   overlaps, which page-cache reads on a 2-core machine cannot show
//
//   stream_bench [--dir DIR] [--preset NAME] [--scale N] [--sessions N] [--sweeps N] [--reps N]
//                [--method pread|mmap|direct] [--config I] [--memcpy 0]
// (--config: only that row of the table; --memcpy 0: no memcpy limit, for profiling)
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device/host/host_device.h"
#include "engine/engine.h"
#include "format/gguf_model.h"
#include "synth/synth.h"

namespace {

using expertd::Engine;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU seconds (user + system) of this process so far, all threads.
double CpuSeconds() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  const auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

void Die(const std::string& what, const absl::Status& st) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

struct Options {
  std::string dir = "/tmp/expertd-stream-bench";
  std::string preset = "mixtral-tiny";
  uint32_t scale = 8;
  uint32_t sessions = 4;
  uint32_t sweeps = 8;  // per session and timed phase
  uint32_t reps = 3;    // timed phases; the fastest counts
  int config = -1;      // run only this configuration (index into the table); -1: all
  bool memcpy = true;   // false: skip the memcpy limit (for profiling the engine alone)
  expertd::ReadMethod method = expertd::ReadMethod::kPread;
};

struct Model {
  std::unique_ptr<expertd::GgufModel> gguf;
  std::unique_ptr<expertd::ModelCatalog> catalog;
};

// Reads every pack once so pread finds it in the page cache.
void WarmPageCache(const expertd::ModelCatalog& catalog) {
  std::vector<uint8_t> chunk(8u << 20);
  for (const expertd::PackInfo& p : catalog.packs()) {
    const int fd = ::open(p.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    for (off_t off = 0; ::pread(fd, chunk.data(), chunk.size(), off) > 0;
         off += static_cast<off_t>(chunk.size())) {
    }
    ::close(fd);
  }
}

// Single-thread memcpy in bundle-sized pieces, cycling through a source the size of the
// model's experts and a destination the size of the pool (both pre-faulted, allocated once).
class MemcpyLimit {
 public:
  MemcpyLimit(uint64_t piece, uint64_t src_bytes, uint64_t dst_bytes)
      : piece_(piece), src_(src_bytes / piece * piece, 1), dst_(dst_bytes / piece * piece, 2) {}
  // GB/s of copying `total` bytes, best of `reps`.
  double Gbps(uint64_t total, int reps) {
    const uint64_t src_pieces = src_.size() / piece_, dst_pieces = dst_.size() / piece_;
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      uint64_t i = 0;
      for (uint64_t done = 0; done < total; done += piece_, ++i) {
        std::memcpy(dst_.data() + (i % dst_pieces) * piece_,
                    src_.data() + (i % src_pieces) * piece_, piece_);
      }
      best = std::min(best, Seconds(t0, Clock::now()));
    }
    if (dst_[dst_.size() / 2] != 1) std::printf("memcpy check failed\n");
    return static_cast<double>(total) / best / 1e9;
  }

 private:
  uint64_t piece_;
  std::vector<uint8_t> src_, dst_;
};

// Start times of read attempts per source group, for the overlap figure.
class ReadTrace {
 public:
  explicit ReadTrace(size_t groups) : starts_(groups) {}
  expertd::PackReadHook Hook(size_t group, uint32_t latency_us) {
    return [this, group, latency_us](uint64_t, uint64_t bytes) -> int64_t {
      if (latency_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(latency_us));
      const double t = Seconds(origin_, Clock::now());
      std::lock_guard<std::mutex> lock(mu_);
      starts_[group].push_back(t);
      return static_cast<int64_t>(bytes);
    };
  }
  void Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : starts_) s.clear();
  }
  // Of the 1 ms intervals in which some group started a read, the share in which all did.
  double Overlap() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::vector<bool>> bins(starts_.size());
    size_t n = 0;
    for (const auto& s : starts_) {
      for (double t : s) n = std::max(n, static_cast<size_t>(t * 1000) + 1);
    }
    size_t any = 0, all = 0;
    for (size_t g = 0; g < starts_.size(); ++g) {
      bins[g].assign(n, false);
      for (double t : starts_[g]) bins[g][static_cast<size_t>(t * 1000)] = true;
    }
    for (size_t i = 0; i < n; ++i) {
      bool a = false, b = true;
      for (const auto& g : bins) a = a || g[i], b = b && g[i];
      any += a;
      all += b;
    }
    return any == 0 ? 0 : double(all) / double(any);
  }

 private:
  const Clock::time_point origin_ = Clock::now();
  std::mutex mu_;
  std::vector<std::vector<double>> starts_;
};

struct Config {
  std::string name;
  uint32_t groups = 1;
  uint32_t reader_threads = 2;  // per group
  bool in_place = true;
  bool trace = false;
  uint32_t drive_latency_us = 0;  // simulated: every read attempt first sleeps this long
  uint32_t sweeps_divisor = 1;    // fewer sweeps for the slow simulated drive
};

struct Result {
  double seconds = 0;      // the fastest phase
  double cpu_seconds = 0;  // CPU time of the process (all threads) during that phase
  uint64_t bytes = 0;      // bundle bytes granted in one timed phase
  uint64_t acquires = 0, hits = 0, joins = 0, retries = 0;  // hits: first phase; joins: all
  std::vector<std::pair<std::string, uint64_t>> group_bytes;
  double overlap = -1;
  expertd::EngineStats stats;
};

Result Run(const Model& m, const Options& opt, const Config& cfg, uint32_t slots) {
  const expertd::ModelCatalog& catalog = *m.catalog;
  const size_t n_packs = catalog.packs().size();
  ReadTrace trace(cfg.groups);
  std::vector<expertd::PackSpec> specs;
  for (size_t i = 0; i < n_packs; ++i) {
    expertd::PackSpec spec;
    spec.path = catalog.packs()[i].path;
    spec.label = catalog.packs()[i].label;
    const size_t group = cfg.groups == 2 && i >= n_packs / 2 ? 1 : 0;
    spec.group = group == 0 ? "A" : "B";
    if (cfg.trace) spec.test_hook = trace.Hook(group, cfg.drive_latency_us);
    specs.push_back(std::move(spec));
  }
  expertd::PackSetOptions po;
  po.method = opt.method;
  auto packs = expertd::PackSet::Open(std::move(specs), po);
  if (!packs.ok()) Die("packs", packs.status());
  auto device = expertd::MakeHostDevice();
  if (!device.ok()) Die("device", device.status());
  expertd::EngineOptions eo;
  eo.slots_per_class = slots;
  eo.policy = "lru";  // a cyclic sweep larger than the pool: every access misses
  eo.predictor = "none";
  eo.readers.threads_per_group = cfg.reader_threads;
  eo.fill_in_place = cfg.in_place;
  auto engine = Engine::Create(catalog, **packs, **device, eo);
  if (!engine.ok()) Die("engine", engine.status());

  const uint32_t top_k = catalog.n_expert_used();
  std::vector<expertd::MappedFences> fences;  // thread-safe; the vector is only read
  for (size_t c = 0; c < catalog.slot_classes().size(); ++c) {
    auto exported = (*engine)->fences(static_cast<uint32_t>(c)).Export();
    if (!exported.ok()) Die("export", exported.status());
    auto mapped = expertd::MapFences(*exported);
    if (!mapped.ok()) Die("map fences", mapped.status());
    fences.push_back(*std::move(mapped));
  }
  std::atomic<uint64_t> bytes{0}, acquires{0}, hits{0}, retries{0};
  std::atomic<bool> failed{false};
  // One sweep of one session: every MoE layer, the session's own top-k experts. Sessions start
  // their sweeps at evenly spread layers, as independent clients would be, so at any time some
  // read the first shard's layers and some the second's.
  const auto sweep = [&](uint32_t s, bool count) {
    const size_t n = catalog.layers().size();
    for (size_t i = 0; i < n; ++i) {
      const expertd::MoeLayer& layer = catalog.layers()[(i + s * n / opt.sessions) % n];
      std::vector<uint32_t> experts;
      for (uint32_t k = 0; k < top_k; ++k) experts.push_back((s * top_k + k) % layer.n_expert);
      absl::StatusOr<expertd::Grant> g = (*engine)->Acquire(layer.block, experts);
      while (!g.ok() && absl::IsUnavailable(g.status())) {
        ++retries;
        std::this_thread::yield();
        g = (*engine)->Acquire(layer.block, experts);
      }
      if (!g.ok()) {
        std::fprintf(stderr, "acquire: %s\n", g.status().ToString().c_str());
        failed = true;
        return;
      }
      for (const expertd::GrantedSlot& gs : g->slots) {
        (void)fences[gs.slot_class].SignalDone(gs.slot, gs.generation);
        if (!count) continue;
        bytes += layer.payload_bytes;
        hits += gs.hit ? 1 : 0;
      }
      if (count) ++acquires;
      (*engine)->Release(*g);
    }
  };
  // Timed phases of `sweeps` sweeps per session between barriers; the fastest phase counts.
  const uint32_t sweeps = std::max<uint32_t>(1, opt.sweeps / cfg.sweeps_divisor);
  std::barrier sync(static_cast<std::ptrdiff_t>(opt.sessions) + 1);
  std::vector<std::thread> threads;
  for (uint32_t s = 0; s < opt.sessions; ++s) {
    threads.emplace_back([&, s] {
      pthread_setname_np(pthread_self(), ("session " + std::to_string(s)).c_str());
      sweep(s, false);  // warm-up: the arenas' pages are touched once
      for (uint32_t rep = 0; rep < opt.reps; ++rep) {
        sync.arrive_and_wait();
        for (uint32_t i = 0; i < sweeps && !failed.load(); ++i) sweep(s, rep == 0);
        sync.arrive_and_wait();
      }
    });
  }
  Result r;
  r.seconds = 1e30;
  for (uint32_t rep = 0; rep < opt.reps; ++rep) {
    sync.arrive_and_wait();
    if (rep == 0) trace.Reset();
    const auto t0 = Clock::now();
    const double cpu0 = CpuSeconds();
    sync.arrive_and_wait();
    const double seconds = Seconds(t0, Clock::now());
    if (seconds < r.seconds) r.seconds = seconds, r.cpu_seconds = CpuSeconds() - cpu0;
  }
  for (auto& t : threads) t.join();
  if (failed.load()) std::exit(1);
  r.bytes = bytes;  // one phase's
  r.acquires = acquires;
  r.hits = hits;
  r.retries = retries;
  r.stats = (*engine)->Stats();
  r.joins = r.stats.pool.joins;
  for (const expertd::SourceGroup& g : (*packs)->groups()) {
    uint64_t b = 0;
    for (expertd::PackId id : g.packs) b += (*packs)->stats(id).bytes_read;
    r.group_bytes.emplace_back(g.name, b);  // all phases, warm-up included
  }
  if (cfg.trace) r.overlap = trace.Overlap();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* v = argv[i + 1];
    if (flag == "--dir") {
      opt.dir = v;
    } else if (flag == "--preset") {
      opt.preset = v;
    } else if (flag == "--scale") {
      opt.scale = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    } else if (flag == "--sessions") {
      opt.sessions = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    } else if (flag == "--sweeps") {
      opt.sweeps = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    } else if (flag == "--method") {
      const absl::StatusOr<expertd::ReadMethod> method = expertd::ParseReadMethod(v);
      if (!method.ok()) Die("--method", method.status());
      opt.method = *method;
    } else if (flag == "--config") {
      opt.config = std::atoi(v);
    } else if (flag == "--memcpy") {
      opt.memcpy = std::string(v) != "0";
    } else if (flag == "--reps") {
      opt.reps = std::max<uint32_t>(1, static_cast<uint32_t>(std::strtoul(v, nullptr, 10)));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  expertd::SynthOptions so;
  so.preset = opt.preset;
  so.out_dir = opt.dir;
  so.scale = opt.scale;
  so.split = 2;  // two shards: two packs, one per source group in the groups configuration
  std::filesystem::remove_all(opt.dir);
  const absl::StatusOr<std::vector<std::string>> files = expertd::SynthesizeModel(so);
  if (!files.ok()) Die("synth", files.status());
  Model m;
  auto gguf = expertd::GgufModel::Open(files->front());
  if (!gguf.ok()) Die("open", gguf.status());
  m.gguf = std::make_unique<expertd::GgufModel>(*std::move(gguf));
  auto catalog = expertd::ModelCatalog::Build(*m.gguf, nullptr);
  if (!catalog.ok()) Die("catalog", catalog.status());
  m.catalog = std::make_unique<expertd::ModelCatalog>(*std::move(catalog));
  const expertd::ModelCatalog& cat = *m.catalog;
  const uint32_t top_k = cat.n_expert_used();
  const uint32_t n_expert = cat.n_expert();
  if (opt.sessions == 0 || opt.sessions * top_k > n_expert) {
    std::fprintf(stderr, "--sessions must be 1..%u (distinct experts per session)\n",
                 n_expert / top_k);
    return 2;
  }
  WarmPageCache(cat);
  // The working set of one sweep of all sessions; the pool holds a quarter of it (at least two
  // acquires per session), so LRU misses every time.
  const uint64_t working = uint64_t{opt.sessions} * top_k * cat.layers().size();
  const auto slots =
      static_cast<uint32_t>(std::max<uint64_t>(working / 4, uint64_t{opt.sessions} * top_k * 2));
  const uint64_t bundle = cat.max_bundle_bytes();
  const uint64_t payload = cat.layers().front().payload_bytes;
  std::printf(
      "model %s --scale %u: %zu MoE layers x %u experts, top-%u, bundle %.0f KiB, %zu "
      "packs (%.0f MiB of experts), read method %s\n",
      opt.preset.c_str(), opt.scale, cat.layers().size(), n_expert, top_k, payload / 1024.0,
      cat.packs().size(), cat.expert_bytes_total() / 1048576.0,
      std::string(expertd::ReadMethodName(opt.method)).c_str());
  std::printf(
      "%u sessions, %u sweeps each per timed phase, fastest of %u phases; pool of %u "
      "slots (working set %llu bundles); %u hardware threads\n\n",
      opt.sessions, opt.sweeps, opt.reps, slots, static_cast<unsigned long long>(working),
      std::thread::hardware_concurrency());
  const std::vector<Config> configs = {
      {"in place (default)", 1, 2, true, false},
      {"staging + copy", 1, 2, false, false},
      {"1 group x 1 reader", 1, 1, true, true},
      {"2 groups x 1 reader", 2, 1, true, true},
      {"1 x 1, drive 0.5 ms", 1, 1, true, true, 500, 8},
      {"2 x 1, drive 0.5 ms", 2, 1, true, true, 500, 8},
  };
  std::printf("%-22s %9s %7s %7s %7s %7s %6s %9s %5s %5s  %s\n", "configuration", "granted",
              "seconds", "GB/s", "memcpy", "ratio", "cores", "GB/CPU-s", "hits", "joins",
              "per group / overlap");
  MemcpyLimit limit(bundle, cat.expert_bytes_total(), uint64_t{slots} * bundle);
  const uint64_t phase_bytes =
      uint64_t{opt.sessions} * opt.sweeps * cat.layers().size() * top_k * payload;
  for (size_t c = 0; c < configs.size(); ++c) {
    const Config& cfg = configs[c];
    if (opt.config >= 0 && static_cast<size_t>(opt.config) != c) continue;
    // The machine may be shared: memcpy of the same bytes is measured right before and after
    // the engine, best of three each; the better figure is the limit the ratio refers to. Not
    // for the simulated drive, whose rate is set by its latency.
    const bool limit_applies = opt.memcpy && cfg.drive_latency_us == 0;
    const double mem_before = limit_applies ? limit.Gbps(phase_bytes, 3) : 0;
    const Result r = Run(m, opt, cfg, slots);
    const double gbps = static_cast<double>(r.bytes) / r.seconds / 1e9;
    const double mem = limit_applies ? std::max(mem_before, limit.Gbps(r.bytes, 3)) : 0;
    char mem_text[32] = "      -       -";
    if (limit_applies) std::snprintf(mem_text, sizeof(mem_text), "%7.2f %7.2f", mem, gbps / mem);
    std::string groups;
    for (const auto& [name, b] : r.group_bytes) {
      groups += name + " " + std::to_string(b >> 20) + " MiB  ";
    }
    if (r.overlap >= 0 && r.group_bytes.size() > 1) {
      groups += "overlap " + std::to_string(r.overlap).substr(0, 4);
    }
    std::printf("%-22s %5.0f MiB %7.3f %7.2f %s %6.2f %9.2f %5llu %5llu  %s\n", cfg.name.c_str(),
                r.bytes / 1048576.0, r.seconds, gbps, mem_text, r.cpu_seconds / r.seconds,
                r.bytes / r.cpu_seconds / 1e9, static_cast<unsigned long long>(r.hits),
                static_cast<unsigned long long>(r.joins), groups.c_str());
    std::fflush(stdout);
  }
  std::filesystem::remove_all(opt.dir);
  return 0;
}
