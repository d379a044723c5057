// The engine side of the daemon-level GPU test (daemon_cuda_pair.sh): a client process of the
// real expertd serving from its CUDA device. It reads granted slots in place through the
// session's IPC arenas, with a CUDA kernel, and checks them against the model file.
//
//   daemon_cuda_client probe
//       exit 0 when a CUDA GPU and the backend are here, 77 (skip) with the reason otherwise
//   daemon_cuda_client wait ADDR SECONDS
//       waits until the daemon's health is SERVING
//   daemon_cuda_client run ADDR GGUF ITERATIONS SEED DELAY_NS [host-wait] [repeat]
//       acquires random top-k experts of random layers (with repeat, every other acquire asks
//       for the previous one's experts again: a hit, served in this process where the session
//       has client-side hits) and, on one stream: WaitReady (with
//       host-wait: WaitReadyOnHost, the CPU waits and the stream does not), a checksum
//       kernel per projection (which first sleeps DELAY_NS on the GPU, to widen the window in
//       which an unsafe overwrite would show), a device-to-host copy of the slot, RecordDone,
//       and Release — before the stream has finished, with 4 iterations in flight, so the
//       daemon's next copies into those slots must wait on the done events. Every checksum is
//       compared with the host's over the GGUF bytes, every copied slot's XXH3 with the GGUF's.
//   daemon_cuda_client latency ADDR ITERATIONS SEED
//       acquire-to-ready on the GPU (Acquire, WaitReady, an event after it, synchronize), for
//       grants with a miss and all-hit grants: p50 / p99
//   daemon_cuda_client stuck ADDR pending|destroyed
//       a client whose done records never complete while its process lives: it reads one grant
//       with a kernel that never ends (pending) or then destroys its own context (destroyed,
//       the simulator only; 77 elsewhere), records done, releases, prints STUCK and waits until
//       the daemon ends its session (exit 0, printing ENDED and the reason; 1 after 60 s)
//   daemon_cuda_client devices ADDR
//       opens a session from a thread that never chose a device, reads one grant on a stream of
//       the GPU the session resolved, checks that a stream of another GPU is refused, and
//       prints RESULT contexts=MASK peer=N wrong=N (simulator counters; "n/a" on a GPU)
//       RESULT counts the leases served in this process (local=N; client_hits=yes|no).
// Prints RESULT lines; any mismatch or error prints FAIL and exits 1.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catalog/catalog.h"
#include "checksum_kernel.h"
#include "client.h"
#include "device/device_probe.h"
#include "format/gguf_model.h"
#include "gpu_test_util.h"
#include "util/file.h"
#include "util/hash.h"

namespace {

using expertd::client::Client;
using expertd::client::Lease;
using expertd::client::Session;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "FAIL: daemon_cuda_client: %s\n", what.c_str());
  std::exit(1);
}

void CudaOk(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

std::unique_ptr<Client> Connect(const std::string& addr) {
  expertd::client::ConnectOptions o;
  o.address = addr;
  auto c = Client::Connect(o);
  if (!c.ok()) Die(c.status().ToString());
  return *std::move(c);
}

std::unique_ptr<Session> Open(Client& c) {
  expertd::client::SessionOptions o;
  o.model = "demo";
  o.client_name = absl::StrCat("daemon_cuda_client-", getpid());
  auto s = c.OpenSession(o);
  if (!s.ok()) Die(absl::StrCat("OpenSession: ", s.status().ToString()));
  if ((*s)->info().device_kind() != "cuda") {
    Die(absl::StrCat("the daemon serves from ", (*s)->info().device(), ", not a CUDA device"));
  }
  return *std::move(s);
}

// Expected bytes' XXH3 and kernel checksum of (layer, expert, projection), read with pread.
class Oracle {
 public:
  explicit Oracle(const std::string& gguf) {
    auto model = expertd::GgufModel::Open(gguf);
    if (!model.ok()) Die(model.status().ToString());
    auto catalog = expertd::ModelCatalog::Build(*model, nullptr);
    if (!catalog.ok()) Die(catalog.status().ToString());
    catalog_ = std::make_unique<expertd::ModelCatalog>(*std::move(catalog));
    for (const auto& p : catalog_->packs()) {
      auto f = expertd::ReadFile::Open(p.path);
      if (!f.ok()) Die(f.status().ToString());
      files_.push_back(std::make_unique<expertd::ReadFile>(*std::move(f)));
    }
  }
  struct Expected {
    uint64_t xxh3 = 0;
    uint64_t checksum = 0;
    uint64_t bytes = 0;
  };
  const Expected& Get(uint32_t layer, uint32_t expert, size_t projection) {
    const auto key = std::make_tuple(layer, expert, projection);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    auto loc = catalog_->Locate(layer, expert, projection);
    if (!loc.ok()) Die(loc.status().ToString());
    std::vector<uint8_t> bytes(loc->bytes);
    if (auto st = files_[loc->pack]->ReadAt(loc->offset, bytes); !st.ok()) Die(st.ToString());
    Expected e{expertd::Xxh3(bytes), expertd::gpu_test::SlotChecksum(bytes), loc->bytes};
    return cache_.emplace(key, e).first->second;
  }

 private:
  std::unique_ptr<expertd::ModelCatalog> catalog_;
  std::vector<std::unique_ptr<expertd::ReadFile>> files_;
  std::map<std::tuple<uint32_t, uint32_t, size_t>, Expected> cache_;
};

std::vector<uint32_t> PickExperts(std::mt19937_64& rng, uint32_t n_expert, uint32_t k) {
  std::vector<uint32_t> all(n_expert);
  for (uint32_t i = 0; i < n_expert; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(std::min(k, n_expert));
  return all;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// One iteration in flight: its lease's expected values and where its results land.
struct Flight {
  Lease lease;
  uint8_t* host = nullptr;         // pinned: the slots' bytes, back to back
  uint64_t* sums_host = nullptr;   // pinned: one checksum per (slot, projection)
  uint64_t* sums_dev = nullptr;
  cudaEvent_t finished = nullptr;
  bool busy = false;
};

int Run(const std::string& addr, const std::string& gguf, int iterations, uint64_t seed,
        uint64_t delay_ns, bool host_wait, bool repeat) {
  auto client = Connect(addr);
  auto session = Open(*client);
  Oracle oracle(gguf);
  const auto& info = session->info();
  const auto& model = info.model();
  uint64_t max_bundle = 0;
  for (const auto& sc : model.slot_classes()) max_bundle = std::max(max_bundle, sc.bundle_bytes());
  const uint32_t k = model.n_expert_used();
  CudaOk(cudaSetDevice(session->cuda_device()), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  CudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  constexpr int kInFlight = 4;
  const size_t sums = size_t{k} * 8;  // up to 8 projections per bundle
  std::vector<Flight> flights(kInFlight);
  for (Flight& f : flights) {
    void* p = nullptr;
    CudaOk(cudaMallocHost(&p, max_bundle * k), "cudaMallocHost");
    f.host = static_cast<uint8_t*>(p);
    CudaOk(cudaMallocHost(&p, sums * 8), "cudaMallocHost");
    f.sums_host = static_cast<uint64_t*>(p);
    CudaOk(cudaMalloc(&p, sums * 8), "cudaMalloc");
    f.sums_dev = static_cast<uint64_t*>(p);
    CudaOk(cudaEventCreateWithFlags(&f.finished, cudaEventDisableTiming), "cudaEventCreate");
  }
  std::mt19937_64 rng(seed);
  uint64_t checked = 0, mismatches = 0, bytes = 0, misses = 0, slots = 0, local = 0;
  uint32_t last_layer = 0;
  std::vector<uint32_t> last;

  const auto settle = [&](Flight& f) {
    CudaOk(cudaEventSynchronize(f.finished), "cudaEventSynchronize");
    size_t n = 0;
    uint64_t off = 0;
    for (const auto& s : f.lease.slots) {
      for (size_t p = 0; p < s.device_projections.size(); ++p, ++n) {
        const Oracle::Expected& e = oracle.Get(f.lease.layer, s.expert, p);
        const uint64_t got_xxh = expertd::Xxh3({f.host + off, e.bytes});
        ++checked;
        if (f.sums_host[n] != e.checksum || got_xxh != e.xxh3) {
          ++mismatches;
          std::fprintf(stderr,
                       "mismatch: layer %u expert %u projection %zu slot %u gen %llu: kernel "
                       "%016llx want %016llx, xxh3 %016llx want %016llx\n",
                       f.lease.layer, s.expert, p, s.slot,
                       static_cast<unsigned long long>(s.generation),
                       static_cast<unsigned long long>(f.sums_host[n]),
                       static_cast<unsigned long long>(e.checksum),
                       static_cast<unsigned long long>(got_xxh),
                       static_cast<unsigned long long>(e.xxh3));
        }
        off += e.bytes;
      }
    }
    f.busy = false;
  };

  const auto t0 = Clock::now();
  for (int it = 0; it < iterations; ++it) {
    Flight& f = flights[it % kInFlight];
    if (f.busy) settle(f);
    const bool again = repeat && it % 2 == 1;
    const uint32_t layer =
        again ? last_layer : model.moe_layers(static_cast<int>(rng() % model.moe_layers_size()));
    const std::vector<uint32_t> experts = again ? last : PickExperts(rng, model.n_expert(), k);
    last_layer = layer;
    last = experts;
    auto lease = session->Acquire(layer, experts);
    if (!lease.ok()) Die(absl::StrCat("acquire: ", lease.status().ToString()));
    local += lease->id >> 63;  // the client library's mark of a lease served in this process
    const absl::Status waited =
        host_wait ? session->WaitReadyOnHost(*lease) : session->WaitReady(*lease, stream);
    if (!waited.ok()) Die(waited.ToString());
    CudaOk(cudaMemsetAsync(f.sums_dev, 0, sums * 8, stream), "cudaMemsetAsync");
    size_t n = 0;
    uint64_t off = 0;
    for (const auto& s : lease->slots) {
      misses += s.hit ? 0 : 1;
      ++slots;
      for (size_t p = 0; p < s.device_projections.size(); ++p, ++n) {
        if (n >= sums) Die("more projections than the test's buffers hold");
        const uint64_t b = oracle.Get(layer, s.expert, p).bytes;
        CudaOk(static_cast<cudaError_t>(LaunchSlotChecksum(s.device_projections[p], b, delay_ns,
                                                           f.sums_dev + n, stream)),
               "checksum kernel launch");
        CudaOk(cudaMemcpyAsync(f.host + off, s.device_projections[p], b, cudaMemcpyDeviceToHost,
                               stream),
               "cudaMemcpyAsync(slot to host)");
        off += b;
        bytes += b;
      }
    }
    CudaOk(cudaMemcpyAsync(f.sums_host, f.sums_dev, n * 8, cudaMemcpyDeviceToHost, stream),
           "cudaMemcpyAsync(sums)");
    if (auto st = session->RecordDone(*lease, stream); !st.ok()) Die(st.ToString());
    CudaOk(cudaEventRecord(f.finished, stream), "cudaEventRecord");
    // Released while the kernels may still run: the daemon must not overwrite these slots
    // before the done records complete.
    if (auto st = session->Release(*lease); !st.ok()) Die(st.ToString());
    f.lease = *std::move(lease);
    f.busy = true;
  }
  for (Flight& f : flights) {
    if (f.busy) settle(f);
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const auto& e : session->TakeAsyncErrors()) {
    Die(absl::StrCat("the daemon refused request ", e.seq(), ": ", e.message()));
  }
  std::printf("RESULT daemon-pair pid=%d wait=%s iterations=%d slots=%llu misses=%llu checked=%llu "
              "mismatches=%llu bytes=%llu seconds=%.2f delay_ns=%llu local=%llu client_hits=%s\n",
              getpid(), host_wait ? "host" : "stream", iterations, static_cast<unsigned long long>(slots),
              static_cast<unsigned long long>(misses), static_cast<unsigned long long>(checked),
              static_cast<unsigned long long>(mismatches), static_cast<unsigned long long>(bytes),
              secs, static_cast<unsigned long long>(delay_ns),
              static_cast<unsigned long long>(local), session->client_hits() ? "yes" : "no");
  session->Close();
  return mismatches == 0 && checked > 0 ? 0 : 1;
}

int Latency(const std::string& addr, int iterations, uint64_t seed) {
  auto client = Connect(addr);
  auto session = Open(*client);
  const auto& model = session->info().model();
  CudaOk(cudaSetDevice(session->cuda_device()), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  CudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t ready = nullptr;
  CudaOk(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming | cudaEventBlockingSync),
         "cudaEventCreate");
  std::mt19937_64 rng(seed);
  std::vector<double> miss_us, hit_us;
  uint32_t last_layer = 0;
  std::vector<uint32_t> last;
  for (int it = 0; it < iterations; ++it) {
    // Every other acquire repeats the previous (layer, expert): a hit; the others pick a random
    // one: mostly misses with a small cache.
    const bool repeat = it % 2 == 1 && !last.empty();
    const uint32_t layer =
        repeat ? last_layer
               : model.moe_layers(static_cast<int>(rng() % model.moe_layers_size()));
    std::vector<uint32_t> experts = repeat ? last : PickExperts(rng, model.n_expert(), 1);
    last_layer = layer;
    last = experts;
    const auto t0 = Clock::now();
    auto lease = session->Acquire(layer, experts);
    if (!lease.ok()) Die(absl::StrCat("acquire: ", lease.status().ToString()));
    if (auto st = session->WaitReady(*lease, stream); !st.ok()) Die(st.ToString());
    CudaOk(cudaEventRecord(ready, stream), "cudaEventRecord");
    CudaOk(cudaEventSynchronize(ready), "cudaEventSynchronize");
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    bool hit = true;
    for (const auto& s : lease->slots) hit = hit && s.hit;
    (hit ? hit_us : miss_us).push_back(us);
    if (auto st = session->RecordDone(*lease, stream); !st.ok()) Die(st.ToString());
    if (auto st = session->Release(*lease); !st.ok()) Die(st.ToString());
  }
  std::printf("RESULT acquire-to-ready miss: n=%zu p50=%.0fus p99=%.0fus; hit: n=%zu p50=%.0fus "
              "p99=%.0fus (one expert, bundle %llu bytes)\n",
              miss_us.size(), Quantile(miss_us, 0.5), Quantile(miss_us, 0.99), hit_us.size(),
              Quantile(hit_us, 0.5), Quantile(hit_us, 0.99),
              static_cast<unsigned long long>(model.slot_classes(0).bundle_bytes()));
  session->Close();
  return miss_us.empty() || hit_us.empty() ? 1 : 0;
}

// One grant of the first MoE layer read on `stream`: WaitReady, a checksum kernel per slot that
// first sleeps `delay_ns`, RecordDone, Release.
void ReadOneGrant(Session& session, cudaStream_t stream, uint64_t delay_ns) {
  const auto& model = session.info().model();
  std::vector<uint32_t> experts;
  for (uint32_t e = 0; e < model.n_expert_used(); ++e) experts.push_back(e);
  auto lease = session.Acquire(model.moe_layers(0), experts);
  if (!lease.ok()) Die(absl::StrCat("acquire: ", lease.status().ToString()));
  if (auto st = session.WaitReady(*lease, stream); !st.ok()) Die(st.ToString());
  void* sum = nullptr;
  CudaOk(cudaMalloc(&sum, 8), "cudaMalloc");
  for (const auto& slot : lease->slots) {
    // The first 256 bytes of the slot's first projection: enough for a kernel that reads it.
    CudaOk(static_cast<cudaError_t>(
               LaunchSlotChecksum(slot.device_projections.at(0), 256, delay_ns, sum, stream)),
           "checksum kernel");
  }
  if (auto st = session.RecordDone(*lease, stream); !st.ok()) Die(st.ToString());
  if (auto st = session.Release(*lease); !st.ok()) Die(st.ToString());
}

int Stuck(const std::string& addr, const std::string& mode) {
  auto client = Connect(addr);
  auto session = Open(*client);
  CudaOk(cudaSetDevice(session->cuda_device()), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  CudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  // A kernel that outlives the test: its done record stays pending while the process lives.
  ReadOneGrant(*session, stream,
               mode == "pending" ? uint64_t{600'000'000'000} : uint64_t{2'000'000'000});
  if (mode == "destroyed") {
    // The kernel sleeps 2 s: its done record is still pending when the context goes.
    if (!DestroyContextForTest()) {
      std::printf("SKIP: only the CUDA simulator can destroy a context on purpose\n");
      std::fflush(stdout);
      std::_Exit(77);
    }
  }
  std::printf("STUCK %s\n", mode.c_str());
  std::fflush(stdout);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  const auto& model = session->info().model();
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    // A hint needs no answer and no GPU work: it fails once the stream has ended.
    const uint32_t expert = 0;
    const absl::Status st = session->Prefetch(model.moe_layers(0), {&expert, 1});
    if (absl::StrContains(st.message(), "ended this session")) {
      std::printf("ENDED: %s\n", std::string(st.message()).c_str());
      std::fflush(stdout);
      std::_Exit(0);  // the pending records and the failed context stay as they are
    }
  }
  std::printf("FAIL: the daemon did not end the session within 60 s\n");
  std::fflush(stdout);
  std::_Exit(1);
}

int Devices(const std::string& addr) {
  // No CUDA call before the session: this thread never chose a device.
  auto client = Connect(addr);
  auto session = Open(*client);
  const int mine = session->cuda_device();
  std::printf("session on %s (UUID %s) is cuda:%d here\n", session->info().device().c_str(),
              session->info().device_uuid().c_str(), mine);
  CudaOk(cudaSetDevice(mine), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  CudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  ReadOneGrant(*session, stream, 0);
  CudaOk(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  unsigned mask = 0;
  int peer = 0, wrong = 0;
  if (ContextReportForTest(&mask, &peer, &wrong)) {
    std::printf("RESULT contexts=%u peer=%d wrong=%d\n", mask, peer, wrong);
  } else {
    std::printf("RESULT contexts=n/a peer=n/a wrong=n/a (counted by the simulator only)\n");
  }
  // Then, on purpose, a stream of another GPU (which creates a context there).
  int count = 0;
  CudaOk(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count > 1) {
    // A stream of another GPU is refused before anything is queued.
    const int other = mine == 0 ? 1 : 0;
    CudaOk(cudaSetDevice(other), "cudaSetDevice");
    cudaStream_t foreign = nullptr;
    CudaOk(cudaStreamCreateWithFlags(&foreign, cudaStreamNonBlocking), "cudaStreamCreate");
    const auto& model = session->info().model();
    const std::vector<uint32_t> first{0};
    auto lease = session->Acquire(model.moe_layers(0), first);
    if (!lease.ok()) Die(lease.status().ToString());
    const absl::Status refused = session->WaitReady(*lease, foreign);
    if (refused.code() != absl::StatusCode::kFailedPrecondition ||
        !absl::StrContains(refused.message(), "belongs to cuda:")) {
      Die(absl::StrCat("a stream of cuda:", other, " was not refused: ", refused.ToString()));
    }
    std::printf("refused: %s\n", std::string(refused.message()).c_str());
    CudaOk(cudaStreamDestroy(foreign), "cudaStreamDestroy");
    // Read it properly, on the right GPU, so it can be released.
    CudaOk(cudaSetDevice(mine), "cudaSetDevice");
    cudaStream_t right = nullptr;
    CudaOk(cudaStreamCreateWithFlags(&right, cudaStreamNonBlocking), "cudaStreamCreate");
    if (auto st = session->WaitReady(*lease, right); !st.ok()) Die(st.ToString());
    if (auto st = session->RecordDone(*lease, right); !st.ok()) Die(st.ToString());
    if (auto st = session->Release(*lease); !st.ok()) Die(st.ToString());
    CudaOk(cudaStreamSynchronize(right), "cudaStreamSynchronize");
  }
  session->Close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> a(argv + 1, argv + argc);
  if (a.size() == 1 && a[0] == "probe") {
    if (!expertd::GetBuildFeatures().cuda_backend) {
      std::printf("SKIP: built without the CUDA backend\n");
      return 77;
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      std::printf("SKIP: no CUDA GPU here (%s)\n", expertd::ProbeDevices().log_line.c_str());
      return 77;
    }
    return 0;
  }
  if (a.size() == 3 && a[0] == "wait") {
    auto client = Connect(a[1]);
    const auto deadline = Clock::now() + std::chrono::seconds(std::atoi(a[2].c_str()));
    while (Clock::now() < deadline) {
      auto h = client->Health("demo");
      if (h.ok() && *h) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    Die("the daemon never reported SERVING");
  }
  if (a.size() >= 6 && a.size() <= 8 && a[0] == "run") {
    bool host_wait = false, repeat = false;
    for (size_t i = 6; i < a.size(); ++i) {
      if (a[i] == "host-wait") {
        host_wait = true;
      } else if (a[i] == "repeat") {
        repeat = true;
      } else {
        Die(absl::StrCat("run: unknown flag ", a[i]));
      }
    }
    return Run(a[1], a[2], std::atoi(a[3].c_str()), std::strtoull(a[4].c_str(), nullptr, 10),
               std::strtoull(a[5].c_str(), nullptr, 10), host_wait, repeat);
  }
  if (a.size() == 3 && a[0] == "stuck" && (a[2] == "pending" || a[2] == "destroyed")) {
    return Stuck(a[1], a[2]);
  }
  if (a.size() == 2 && a[0] == "devices") return Devices(a[1]);
  if (a.size() == 4 && a[0] == "latency") {
    return Latency(a[1], std::atoi(a[2].c_str()), std::strtoull(a[3].c_str(), nullptr, 10));
  }
  std::fprintf(stderr, "usage: see the top of daemon_cuda_client.cpp\n");
  return 2;
}
