// GPU test (label gpu), two processes: IPC events at the daemon's real scale. The daemon makes
// per slot a ready and a done event, and per session one more done event per slot
// (Device::CreateSessionFences); each client opens its sessions' events. What do they cost up
// to the driver's bound of IPC events per process? This process plays the daemon: a CUDA
// device, CreateFences(slots), `sessions` session fence sets, their Export(); a second process
// (this executable with --child) plays a client: OpenCudaEventsIfBuilt once per session
// descriptor. Both print what it cost:
//
//   RESULT ipc_events_open slots=N sessions=S events=E open_us_per_event=... open_ms=...  (child)
//   RESULT ipc_events slots=N sessions=S events=E create_us_per_event=... export_us_per_event=...
//          open_us_per_event=... destroy_us_per_event=... create_ms=... export_ms=... open_ms=...
//          (parent, one line)
//
// E = slots * (2 + sessions), the distinct events (the ready events are shared by every
// session: a client that opens them again per session pays more per event, which shows).
// Then it checks that they work: for `records` slots spread over the table, a copy records
// ready; the child waits for it and records done in every session on a stream held by a host
// function; the daemon declares done and overwrites the slots: the overwrites must stay held
// while the child's records are pending (the device sees them through cudaEventQuery) and
// finish once the child's stream goes on, with the new bytes in the arena.
//
// First, a table beyond the process's IPC event bound (caps().max_fence_objects: 4096, what the
// driver allows on an H200 with CUDA 13) must be refused up front with ResourceExhausted and
// leave nothing behind. The default size fills the bound exactly: 1024 slots x (2 + 2).
//
// Usage: ipc_event_scale [--slots N] [--sessions S] [--records K]   (1024, 2, 8)
// Exits 77 without a GPU or the CUDA backend.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "device/cuda_factory.h"
#include "device/device.h"
#include "gpu_test_util.h"

namespace expertd {
namespace {

using Clock = std::chrono::steady_clock;
using gpu_test::Checks;

constexpr uint64_t kSlotBytes = 4096;  // bytes each checked slot gets copied

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("ipc_event_scale");
}

double UsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

struct Options {
  uint32_t slots = 1024;
  uint32_t sessions = 2;
  uint32_t records = 8;
};

// The `records` slots the test records and overwrites: spread from 0 to slots - 1.
std::vector<SlotId> CheckedSlots(const Options& o) {
  std::vector<SlotId> out;
  const uint32_t k = std::min(o.records, o.slots);
  for (uint32_t i = 0; i < k; ++i) {
    out.push_back(k == 1 ? 0 : static_cast<SlotId>(uint64_t{i} * (o.slots - 1) / (k - 1)));
  }
  return out;
}

// ---- the client process

int ChildFail(const std::string& why) {
  std::printf("ERROR %s\n", why.c_str());
  std::fflush(stdout);
  return 1;
}

void CUDART_CB HoldUntilGo(void*) {
  std::string line;
  gpu_test::ReadLine(stdin, &line);
}

// Protocol (stdin from the daemon, stdout to it):
//   SESSION <n_slots> <hex: n ready then n done handles>   (S times)  → OPENED <us>
//   RECORD <generation> <slot>...  → RECORDED (the stream is held until a GO line, then) DONE
//   QUIT
int RunChild() {
  std::vector<std::shared_ptr<CudaSessionEvents>> sessions;
  double open_us = 0;
  uint32_t slots = 0;
  std::string line;
  while (gpu_test::ReadLine(stdin, &line)) {
    std::istringstream in(line);
    std::string verb;
    in >> verb;
    if (verb == "QUIT") break;
    if (verb == "SESSION") {
      std::string hex;
      FenceExport e;
      in >> e.n_slots >> hex;
      e.handle.kind = SharedHandle::Kind::kCudaIpc;
      if (!gpu_test::Unhex(hex, &e.handle.ipc_handle)) return ChildFail("bad hex");
      e.done_offset = uint64_t{e.n_slots} * 64;
      e.segment_bytes = 2 * e.done_offset;
      const Clock::time_point t0 = Clock::now();
      auto opened = OpenCudaEventsIfBuilt(e, 0);
      const double us = UsSince(t0);
      if (!opened.ok()) return ChildFail(opened.status().ToString());
      if ((*opened)->size() != e.n_slots) return ChildFail("opened events: wrong size");
      open_us += us;
      slots = e.n_slots;
      sessions.push_back(*std::move(opened));
      std::printf("OPENED %.0f\n", us);
      std::fflush(stdout);
      continue;
    }
    if (verb != "RECORD" || sessions.empty()) return ChildFail("unexpected line: " + line);
    uint64_t generation = 0;
    in >> generation;
    std::vector<SlotId> record;
    for (SlotId s; in >> s;) record.push_back(s);
    const uint64_t events = uint64_t{slots} * (1 + sessions.size());
    std::printf("RESULT ipc_events_open slots=%u sessions=%zu events=%" PRIu64
                " open_us_per_event=%.2f open_ms=%.1f\n",
                slots, sessions.size(), events, open_us / static_cast<double>(events),
                open_us / 1000);
    cudaStream_t stream = nullptr;
    if (cudaSetDevice(0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      return ChildFail("cannot create a stream");
    }
    // Held until GO: the done records below stay pending meanwhile.
    if (cudaLaunchHostFunc(stream, HoldUntilGo, nullptr) != cudaSuccess) {
      return ChildFail("cudaLaunchHostFunc");
    }
    for (const auto& events_of_session : sessions) {
      for (SlotId s : record) {
        if (absl::Status st = events_of_session->WaitReady(s, generation, stream); !st.ok()) {
          return ChildFail(absl::StrCat("WaitReady ", s, ": ", st.ToString()));
        }
        if (absl::Status st = events_of_session->RecordDone(s, generation, stream); !st.ok()) {
          return ChildFail(absl::StrCat("RecordDone ", s, ": ", st.ToString()));
        }
      }
    }
    std::printf("RECORDED\n");
    std::fflush(stdout);
    if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
      return ChildFail(std::string("cudaStreamSynchronize: ") + cudaGetErrorString(e));
    }
    (void)cudaStreamDestroy(stream);
    std::printf("DONE\n");
    std::fflush(stdout);
  }
  sessions.clear();
  return 0;
}

// ---- the daemon process

struct Daemon {
  Checks checks;
  gpu_test::Child child;

  void Send(const std::string& line) {
    std::fprintf(child.to, "%s\n", line.c_str());
    std::fflush(child.to);
  }
  std::string Expect(const std::string& verb) {
    std::string line;
    if (!gpu_test::ReadLine(child.from, &line)) line = "(the client closed its output)";
    while (line.rfind("RESULT ", 0) == 0) {  // the client's figures: pass them on
      std::printf("%s\n", line.c_str());
      if (!gpu_test::ReadLine(child.from, &line)) line = "(the client closed its output)";
    }
    checks.Expect(line.rfind(verb, 0) == 0, absl::StrCat("expected ", verb, ", got: ", line));
    return line;
  }
};

int Run(const Options& o) {
  ::signal(SIGPIPE, SIG_IGN);  // a client that died fails the checks, not this process
  Daemon d;
  auto made = MakeCudaDeviceIfBuilt(CudaDeviceOptions{});
  if (!d.checks.Ok(made.status(), "MakeCudaDeviceIfBuilt"))
    return d.checks.Finish("ipc_event_scale");
  std::unique_ptr<Device> device = *std::move(made);
  const uint64_t events = uint64_t{o.slots} * (2 + o.sessions);
  std::printf("%s: %u slots, %u sessions: %" PRIu64 " IPC events\n",
              std::string(device->name()).c_str(), o.slots, o.sessions, events);

  // Beyond the process's bound: refused up front, naming it, with nothing kept.
  const uint32_t limit = device->caps().max_fence_objects;
  d.checks.Expect(limit > 0, "the CUDA device reports its IPC event bound (max_fence_objects)");
  if (limit > 0) {
    auto too_many = device->CreateFences(limit / 2 + 1);
    d.checks.Expect(too_many.status().code() == absl::StatusCode::kResourceExhausted &&
                        absl::StrContains(too_many.status().message(), "IPC events"),
                    absl::StrCat("a table of ", limit / 2 + 1, " slots (", limit + 2,
                                 " IPC events) refused with ResourceExhausted naming IPC "
                                 "events, got: ", too_many.status().ToString()));
    d.checks.Expect(device->fence_objects_in_use() == 0,
                    absl::StrCat("no IPC event kept after the refusal: ",
                                 device->fence_objects_in_use()));
  }

  // Create: the table (ready + done per slot), then each session's done events.
  const Clock::time_point t_create = Clock::now();
  auto table_or = device->CreateFences(o.slots);
  if (!d.checks.Ok(table_or.status(), "CreateFences")) return d.checks.Finish("ipc_event_scale");
  std::unique_ptr<FenceTable> table = *std::move(table_or);
  std::vector<std::unique_ptr<SessionFences>> sessions;
  for (uint32_t i = 0; i < o.sessions; ++i) {
    auto s = device->CreateSessionFences(*table);
    if (!d.checks.Ok(s.status(), absl::StrCat("CreateSessionFences ", i))) {
      return d.checks.Finish("ipc_event_scale");
    }
    sessions.push_back(*std::move(s));
  }
  const double create_us = UsSince(t_create);

  // Export: each session's descriptor (the first one also makes the ready handles).
  std::vector<FenceExport> exports;
  const Clock::time_point t_export = Clock::now();
  for (uint32_t i = 0; i < o.sessions; ++i) {
    auto e = sessions[i]->Export();
    if (!d.checks.Ok(e.status(), absl::StrCat("SessionFences::Export ", i))) {
      return d.checks.Finish("ipc_event_scale");
    }
    exports.push_back(*std::move(e));
  }
  const double export_us = UsSince(t_export);
  for (const FenceExport& e : exports) {
    d.checks.Expect(e.n_slots == o.slots && e.handle.ipc_handle.size() == 128ull * o.slots,
                    "session export layout: n ready then n done handles");
  }
  d.checks.Expect(o.sessions < 2 || exports[0].handle.ipc_handle.substr(0, 64ull * o.slots) ==
                                        exports[1].handle.ipc_handle.substr(0, 64ull * o.slots),
                  "sessions share the table's ready handles");
  d.checks.Expect(o.sessions < 2 || exports[0].handle.ipc_handle.substr(64ull * o.slots) !=
                                        exports[1].handle.ipc_handle.substr(64ull * o.slots),
                  "each session has its own done handles");

  // Open: the client process, once per session descriptor.
  if (!d.checks.Ok(gpu_test::Spawn({SelfPath(), "--child"},
                                   /*pipes=*/true, &d.child),
                   "spawn")) {
    return d.checks.Finish("ipc_event_scale");
  }
  const Clock::time_point t_open = Clock::now();
  double open_us = 0;  // as the client measured it, around OpenCudaEventsIfBuilt
  for (const FenceExport& e : exports) {
    d.Send(absl::StrCat("SESSION ", e.n_slots, " ", gpu_test::Hex(e.handle.ipc_handle)));
    const std::string line = d.Expect("OPENED");
    if (line.rfind("OPENED ", 0) == 0) open_us += std::strtod(line.c_str() + 7, nullptr);
  }
  const double open_with_transfer_us = UsSince(t_open);
  if (d.checks.failures() > 0) {
    d.Send("QUIT");
    d.child.Wait();
    return d.checks.Finish("ipc_event_scale");
  }

  // Use: ready records by copies, done records in the client, overwrites held until those
  // complete.
  const std::vector<SlotId> checked = CheckedSlots(o);
  const size_t k = checked.size();
  auto arena = device->AllocateArena(k * kSlotBytes, "ipc_event_scale arena");
  auto staging = device->AllocateStaging(2 * k * kSlotBytes);
  if (!d.checks.Ok(arena.status(), "AllocateArena") ||
      !d.checks.Ok(staging.status(), "AllocateStaging")) {
    d.Send("QUIT");
    d.child.Wait();
    return d.checks.Finish("ipc_event_scale");
  }
  auto source = [&](size_t i, uint64_t generation) {
    return (*staging)->data().subspan(((generation - 1) * k + i) * kSlotBytes, kSlotBytes);
  };
  std::atomic<int> completed{0};
  std::vector<absl::Status> statuses(2 * k);
  auto submit = [&](size_t i, uint64_t generation) {
    gpu_test::FillPattern(source(i, generation), checked[i], generation);
    CopyRequest r;
    r.segments.push_back(CopySegment{source(i, generation), arena->get(), i * kSlotBytes});
    r.priority = CopyPriority::kDemand;
    if (generation > 1) r.waits.push_back(FenceWait{table.get(), checked[i], generation - 1});
    r.signals.push_back(FenceSignal{table.get(), checked[i], generation});
    const size_t index = (generation - 1) * k + i;
    d.checks.Ok(device->SubmitCopy(std::move(r),
                                   [&statuses, &completed, index](absl::Status st) {
                                     statuses[index] = std::move(st);
                                     completed.fetch_add(1);
                                   }),
                absl::StrCat("SubmitCopy slot ", checked[i], " generation ", generation));
  };
  for (size_t i = 0; i < k; ++i) submit(i, 1);
  d.checks.Ok(device->Drain(absl::Seconds(30)), "Drain generation 1");
  std::string record = "RECORD 1";
  for (size_t i = 0; i < k; ++i) {
    d.checks.Expect(table->ready(checked[i]) == 1, absl::StrCat("ready[", checked[i], "] = 1"));
    absl::StrAppend(&record, " ", checked[i]);
  }
  d.Send(record);
  d.Expect("RECORDED");
  for (auto& s : sessions) {
    for (SlotId slot : checked) d.checks.Ok(s->DeclareDone(slot, 1), "DeclareDone");
  }
  for (size_t i = 0; i < k; ++i) submit(i, 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  d.checks.Expect(
      completed.load() == static_cast<int>(k),
      absl::StrCat("overwrites held while the client's done records are pending (",
                   completed.load() - static_cast<int>(k), " of ", k, " finished early)"));
  for (SlotId slot : checked) {
    d.checks.Expect(table->ready(slot) == 1, absl::StrCat("no ready record of slot ", slot,
                                                          " before the client's done records"));
  }
  const Clock::time_point t_go = Clock::now();
  d.Send("GO");
  d.checks.Ok(device->Drain(absl::Seconds(30)), "Drain generation 2");
  const double seen_us = UsSince(t_go);
  d.Expect("DONE");
  for (size_t i = 0; i < k; ++i) {
    d.checks.Ok(statuses[k + i], absl::StrCat("overwrite of slot ", checked[i]));
    d.checks.Expect(table->ready(checked[i]) == 2, absl::StrCat("ready[", checked[i], "] = 2"));
    std::vector<uint8_t> back(kSlotBytes);
    if (d.checks.Ok(device->ReadArena(**arena, i * kSlotBytes, back), "ReadArena")) {
      bool same = true;
      for (uint64_t b = 0; b < kSlotBytes; ++b) {
        same = same && back[b] == gpu_test::PatternByte(checked[i], 2, b);
      }
      d.checks.Expect(same, absl::StrCat("slot ", checked[i], " holds the overwrite's bytes"));
    }
  }
  d.Send("QUIT");
  const int rc = d.child.Wait();
  d.checks.Expect(rc == 0, absl::StrCat("client exit status ", rc));
  d.checks.Ok(device->Health(), "Health");

  const Clock::time_point t_destroy = Clock::now();
  sessions.clear();
  table.reset();
  const double destroy_us = UsSince(t_destroy);
  const double ev = static_cast<double>(events);
  std::printf("RESULT ipc_events slots=%u sessions=%u events=%" PRIu64
              " create_us_per_event=%.2f export_us_per_event=%.2f open_us_per_event=%.2f"
              " destroy_us_per_event=%.2f create_ms=%.1f export_ms=%.1f open_ms=%.1f"
              " open_with_transfer_ms=%.1f destroy_ms=%.1f records_seen_after_go_ms=%.1f\n",
              o.slots, o.sessions, events, create_us / ev, export_us / ev,
              open_us / static_cast<double>(uint64_t{o.slots} * (1 + o.sessions)), destroy_us / ev,
              create_us / 1000, export_us / 1000, open_us / 1000, open_with_transfer_us / 1000,
              destroy_us / 1000, seen_us / 1000);
  arena->reset();
  staging->reset();
  device->Shutdown();
  return d.checks.Finish("ipc_event_scale");
}

bool ParseFlag(int argc, char** argv, int* i, const char* name, uint32_t* value) {
  if (std::string(argv[*i]) != name || *i + 1 >= argc) return false;
  char* end = nullptr;
  const unsigned long v = std::strtoul(argv[*i + 1], &end, 10);
  if (end == argv[*i + 1] || *end != '\0' || v == 0 || v > 65536) return false;
  *value = static_cast<uint32_t>(v);
  ++*i;
  return true;
}

}  // namespace
}  // namespace expertd

int main(int argc, char** argv) {
  ::alarm(300);  // a hung GPU call ends the test instead of the test run
  if (argc == 2 && std::string(argv[1]) == "--child") return expertd::RunChild();
  expertd::Options o;
  for (int i = 1; i < argc; ++i) {
    if (!expertd::ParseFlag(argc, argv, &i, "--slots", &o.slots) &&
        !expertd::ParseFlag(argc, argv, &i, "--sessions", &o.sessions) &&
        !expertd::ParseFlag(argc, argv, &i, "--records", &o.records)) {
      std::fprintf(stderr,
                   "usage: ipc_event_scale [--slots N] [--sessions S] [--records K]"
                   "   (1..65536 each; defaults 1024, 2, 8)\n");
      return 2;
    }
  }
  expertd::gpu_test::SkipWithoutGpu();
  return expertd::Run(o);
}
