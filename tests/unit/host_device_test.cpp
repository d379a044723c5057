// The host device: shared-memory arenas and fences (also seen from a second process),
// prioritized asynchronous copies that wait on done fences, shutdown, and errors.
#include "device/host/host_device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "device/device.h"
#include "device/host/host_shared_memory.h"
#include "support/host_device_args.h"
#include "support/shm_platform.h"
#include "support/test_support.h"
#include "util/process.h"

namespace expertd {
namespace {

using Backing = HostDeviceOptions::Backing;
constexpr uint64_t kMiB = uint64_t{1} << 20;

using testing::Pattern;

void Fill(std::span<uint8_t> bytes, uint32_t seed) {
  for (uint64_t i = 0; i < bytes.size(); ++i) bytes[i] = Pattern(seed, i);
}

bool Matches(const uint8_t* bytes, uint64_t n, uint32_t seed) {
  for (uint64_t i = 0; i < n; ++i) {
    if (bytes[i] != Pattern(seed, i)) return false;
  }
  return true;
}

bool AllZero(const uint8_t* bytes, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (bytes[i] != 0) return false;
  }
  return true;
}

std::unique_ptr<Device> NewDevice(HostDeviceOptions options = {}) {
  auto device = MakeHostDevice(std::move(options));
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? std::move(*device) : nullptr;
}

template <typename T>
T Must(absl::StatusOr<T> v) {
  EXPECT_TRUE(v.ok()) << v.status();
  // The test cannot go on; gtest reports the exception as a failure and runs the next test.
  if (!v.ok()) throw std::runtime_error(v.status().ToString());
  return std::move(*v);
}

// A completion that tests can wait for.
class Completion {
 public:
  CopyCallback Callback() {
    return [this](absl::Status s) {
      std::lock_guard lock(mu_);
      status_ = std::move(s);
      ++calls_;
      cv_.notify_all();
    };
  }
  bool WaitFor(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return calls_ > 0; });
  }
  int calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }
  absl::Status status() {
    std::lock_guard lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
  absl::Status status_ = absl::UnknownError("not called");
};

CopyRequest OneCopy(std::span<const uint8_t> source, Arena* arena, uint64_t offset,
                    CopyPriority priority = CopyPriority::kPrefetch) {
  CopyRequest r;
  r.segments.push_back(CopySegment{source, arena, offset});
  r.priority = priority;
  return r;
}

TEST(HostDeviceTest, NameAndCapabilities) {
  auto device = NewDevice({.copy_threads = 3, .max_arena_bytes = 64 * kMiB});
  EXPECT_EQ(device->name(), "host");
  const Capabilities& caps = device->caps();
  EXPECT_TRUE(caps.arenas_host_visible);
  EXPECT_TRUE(caps.exports_to_other_processes);
  EXPECT_TRUE(caps.async_copies);
  EXPECT_TRUE(caps.copy_priorities);
  EXPECT_TRUE(caps.fences_host_visible);
  EXPECT_FALSE(caps.staging_pinned);
  EXPECT_EQ(caps.copy_engines, 3u);
  EXPECT_EQ(caps.max_arena_bytes, 64 * kMiB);
  EXPECT_GT(caps.max_staging_bytes, 0u);
}

TEST(HostDeviceTest, ArenaOfWhole2MiBKeepsATail) {
  auto device = NewDevice();
  auto arena = Must(device->AllocateArena(2 * kMiB, "L0.ffn_down_exps"));
  EXPECT_EQ(arena->bytes(), 2 * kMiB);
  EXPECT_EQ(arena->reserved_bytes(), 4 * kMiB);
  EXPECT_TRUE(AllZero(arena->host_data() + arena->bytes(), 64 * 1024));
  auto tight = Must(device->AllocateArena(2 * kMiB - 64 * 1024, "L0.ffn_up_exps"));
  EXPECT_EQ(tight->reserved_bytes(), 2 * kMiB);
  auto over = Must(device->AllocateArena(2 * kMiB - 64 * 1024 + 1, "L0.ffn_gate_exps"));
  EXPECT_EQ(over->reserved_bytes(), 4 * kMiB);
}

TEST(HostDeviceTest, ArenaRoundsUpTo2MiBWithZeroTail) {
  auto device = NewDevice();
  auto arena = Must(device->AllocateArena(3 * kMiB + 5, "L3.ffn_up_exps"));
  EXPECT_EQ(arena->bytes(), 3 * kMiB + 5);
  EXPECT_EQ(arena->reserved_bytes(), 4 * kMiB);
  EXPECT_EQ(arena->label(), "L3.ffn_up_exps");
  ASSERT_NE(arena->host_data(), nullptr);
  EXPECT_TRUE(AllZero(arena->host_data(), arena->reserved_bytes()));

  // Fill every usable byte: the padding after them stays zero.
  auto staging = Must(device->AllocateStaging(arena->bytes()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(staging->data().data()) % 4096, 0u);
  Fill(staging->data(), 7);
  Completion done;
  ASSERT_TRUE(device->SubmitCopy(OneCopy(staging->data(), arena.get(), 0), done.Callback()).ok());
  ASSERT_TRUE(done.WaitFor(std::chrono::seconds(5)));
  EXPECT_TRUE(done.status().ok()) << done.status();
  EXPECT_TRUE(Matches(arena->host_data(), arena->bytes(), 7));
  EXPECT_TRUE(
      AllZero(arena->host_data() + arena->bytes(), arena->reserved_bytes() - arena->bytes()));

  std::vector<uint8_t> back(16);
  ASSERT_TRUE(device->ReadArena(*arena, 100, back).ok());
  EXPECT_TRUE(std::equal(back.begin(), back.end(), staging->data().begin() + 100));
  EXPECT_FALSE(device->ReadArena(*arena, arena->reserved_bytes() - 8, back).ok());
}

class HostDeviceBackingTest : public ::testing::TestWithParam<Backing> {
 protected:
  HostDeviceOptions Options() {
    HostDeviceOptions o;
    o.backing = GetParam();
    o.shm_prefix = "expertd-test";
    return o;
  }
};

TEST_P(HostDeviceBackingTest, ExportedArenaMapsToTheSameBytes) {
  auto device = NewDevice(Options());
  auto arena = Must(device->AllocateArena(kMiB, "arena"));
  const ArenaExport descriptor = Must(arena->Export());
  EXPECT_EQ(descriptor.bytes, kMiB);
  EXPECT_EQ(descriptor.reserved_bytes, 2 * kMiB);
  EXPECT_EQ(descriptor.handle.shm_name.empty(), GetParam() == Backing::kMemfd);
  if (GetParam() == Backing::kShmOpen) {
    EXPECT_EQ(descriptor.handle.shm_name.rfind(testing::ShmNamePrefix("expertd-test"), 0), 0u)
        << descriptor.handle.shm_name;
  }
  const MappedArena mapped = Must(MapArena(descriptor));
  EXPECT_EQ(mapped.bytes(), kMiB);
  EXPECT_EQ(mapped.reserved_bytes(), 2 * kMiB);

  auto staging = Must(device->AllocateStaging(4096));
  Fill(staging->data(), 3);
  Completion done;
  ASSERT_TRUE(
      device->SubmitCopy(OneCopy(staging->data(), arena.get(), 8192), done.Callback()).ok());
  ASSERT_TRUE(done.WaitFor(std::chrono::seconds(5)));
  EXPECT_TRUE(Matches(mapped.data().data() + 8192, 4096, 3));
  EXPECT_TRUE(AllZero(mapped.data().data(), 8192));

  // The client's mapping is read-only.
  EXPECT_FALSE(testing::MemoryWritable(mapped.data().data(), 4096));
}

// A real second process (host_device_child) maps the arena and its session's fences by their
// descriptors, waits for a copy the parent makes after it started, checks the bytes and stores
// its done fence, which the daemon's side then declares. With anonymous objects it reaches them
// through the daemon's process (/proc/<pid>/fd, or a handle duplicated out of it), and cannot
// open the arena or the table for writing that way (memfd: sealed; Windows: the exported handle
// has read access only).
TEST_P(HostDeviceBackingTest, SecondProcessSeesCopiesAndItsDoneFence) {
  auto device = NewDevice(Options());
  constexpr uint64_t kStride = 65536;
  constexpr SlotId kSlot = 1;
  auto arena = Must(device->AllocateArena(4 * kStride, "shared"));
  auto fences = Must(device->CreateFences(4));
  auto session = Must(device->CreateSessionFences(*fences));
  const ArenaExport arena_export = Must(arena->Export());
  const FenceExport fence_export = Must(session->Export());
  ASSERT_TRUE(fence_export.session_done.has_value());
  const bool anonymous = GetParam() == Backing::kMemfd;

  std::vector<std::string> argv = {EXPERTD_HOST_DEVICE_CHILD, absl::StrCat(kSlot),
                                   absl::StrCat(kStride), "42", anonymous ? "readonly" : "any"};
  testing::AppendHandle(argv, arena_export.handle);
  argv.push_back(absl::StrCat(arena_export.bytes));
  argv.push_back(absl::StrCat(arena_export.reserved_bytes));
  testing::AppendHandle(argv, fence_export.handle);
  testing::AppendHandle(argv, *fence_export.session_done);
  argv.push_back(absl::StrCat(fence_export.n_slots));
  argv.push_back(absl::StrCat(fence_export.done_offset));
  argv.push_back(absl::StrCat(fence_export.segment_bytes));
  ChildProcess child = Must(ChildProcess::Start(argv));

  auto staging = Must(device->AllocateStaging(kStride));
  Fill(staging->data(), 42);
  CopyRequest request = OneCopy(staging->data(), arena.get(), kSlot * kStride);
  request.signals.push_back(FenceSignal{fences.get(), kSlot, 1});
  Completion copied;
  ASSERT_TRUE(device->SubmitCopy(std::move(request), copied.Callback()).ok());
  EXPECT_EQ(Must(child.Wait()), 0) << "10 map fences, 11 map arena, 12 wait ready, 13 bytes, "
                                      "14 padding, 15 signal done, 16/17 arena/table writable";
  EXPECT_TRUE(session->Signalled(kSlot, 1));
  EXPECT_TRUE(session->DeclareDone(kSlot, 1).ok());
  EXPECT_EQ(fences->done(kSlot), 1u);
  EXPECT_EQ(fences->ready(kSlot), 1u);
  ASSERT_TRUE(copied.WaitFor(std::chrono::seconds(5)));
  EXPECT_TRUE(copied.status().ok());
}

TEST_P(HostDeviceBackingTest, DestroyedArenaIsUnlinkedButMappingsLive) {
  auto device = NewDevice(Options());
  auto arena = Must(device->AllocateArena(kMiB, "gone"));
  const ArenaExport descriptor = Must(arena->Export());
  const MappedArena mapped = Must(MapArena(descriptor));
  arena.reset();
  EXPECT_TRUE(AllZero(mapped.data().data(), mapped.reserved_bytes()));
  const auto again = MapArena(descriptor);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
}

INSTANTIATE_TEST_SUITE_P(Backings, HostDeviceBackingTest,
                         ::testing::Values(Backing::kShmOpen, Backing::kMemfd),
                         [](const auto& param_info) {
                           return param_info.param == Backing::kShmOpen ? "ShmOpen" : "Memfd";
                         });

TEST(HostDeviceTest, ManyConcurrentCopiesLandWhereAsked) {
  auto device = NewDevice({.copy_threads = 3});
  constexpr uint64_t kThreads = 4;
  constexpr uint64_t kPerThread = 64;
  constexpr uint64_t kSlotBytes = 4096;
  auto arena = Must(device->AllocateArena(kThreads * kPerThread * kSlotBytes, "many"));
  std::atomic<uint64_t> ok{0};
  std::atomic<uint64_t> calls{0};
  std::vector<std::unique_ptr<StagingBuffer>> staging;
  staging.reserve(kThreads);
  for (uint64_t t = 0; t < kThreads; ++t) {
    staging.push_back(Must(device->AllocateStaging(kPerThread * kSlotBytes)));
  }
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (uint64_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < kPerThread; ++i) {
        const uint64_t slot = t * kPerThread + i;
        std::span<uint8_t> source = staging[t]->data().subspan(i * kSlotBytes, kSlotBytes);
        Fill(source, static_cast<uint32_t>(slot));
        const auto priority = i % 3 == 0 ? CopyPriority::kDemand : CopyPriority::kPrefetch;
        const absl::Status s = device->SubmitCopy(
            OneCopy(source, arena.get(), slot * kSlotBytes, priority), [&](const absl::Status& st) {
              if (st.ok()) ok.fetch_add(1);
              calls.fetch_add(1);
            });
        EXPECT_TRUE(s.ok()) << s;
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(device->Drain(absl::Seconds(10)).ok());
  EXPECT_EQ(calls.load(), kThreads * kPerThread);
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  for (uint64_t slot = 0; slot < kThreads * kPerThread; ++slot) {
    ASSERT_TRUE(
        Matches(arena->host_data() + slot * kSlotBytes, kSlotBytes, static_cast<uint32_t>(slot)))
        << slot;
  }
}

// With one copy thread held inside a completion callback, the queue order is fixed: demand
// copies queued after prefetch copies still run first.
TEST(HostDeviceTest, DemandCopiesOvertakeQueuedPrefetch) {
  auto device = NewDevice({.copy_threads = 1});
  auto arena = Must(device->AllocateArena(kMiB, "order"));
  auto staging = Must(device->AllocateStaging(4096));
  std::promise<void> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ASSERT_TRUE(device
                  ->SubmitCopy(OneCopy(staging->data(), arena.get(), 0),
                               [&](const absl::Status&) {
                                 started.set_value();
                                 released.wait();
                               })
                  .ok());
  started.get_future().wait();

  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](const std::string& name) {
    return [&, name](const absl::Status& s) {
      EXPECT_TRUE(s.ok()) << s;
      std::lock_guard lock(mu);
      order.push_back(name);
    };
  };
  const auto submit = [&](const std::string& name, CopyPriority p) {
    ASSERT_TRUE(
        device->SubmitCopy(OneCopy(staging->data(), arena.get(), 4096, p), record(name)).ok());
  };
  submit("p1", CopyPriority::kPrefetch);
  submit("p2", CopyPriority::kPrefetch);
  submit("d1", CopyPriority::kDemand);
  submit("p3", CopyPriority::kPrefetch);
  submit("d2", CopyPriority::kDemand);
  release.set_value();
  ASSERT_TRUE(device->Drain(absl::Seconds(5)).ok());
  EXPECT_EQ(order, (std::vector<std::string>{"d1", "d2", "p1", "p2", "p3"}));
}

TEST(HostDeviceTest, CopyWaitsForTheSlotsDoneFence) {
  auto device = NewDevice({.copy_threads = 2});
  auto arena = Must(device->AllocateArena(uint64_t{4} * 4096, "fenced"));
  auto fences = Must(device->CreateFences(4));
  MappedFences client = Must(MapFences(Must(fences->Export())));
  constexpr SlotId kSlot = 2;
  // The previous occupant was granted as generation 3; the client has not finished reading it.
  ASSERT_TRUE(fences->AdvanceReady(kSlot, 3).ok());
  ASSERT_TRUE(client.SignalDone(kSlot, 2).ok());

  auto staging = Must(device->AllocateStaging(4096));
  Fill(staging->data(), 9);
  CopyRequest request =
      OneCopy(staging->data(), arena.get(), kSlot * uint64_t{4096}, CopyPriority::kDemand);
  request.waits.push_back(FenceWait{fences.get(), kSlot, 3});
  request.signals.push_back(FenceSignal{fences.get(), kSlot, 4});
  Completion done;
  ASSERT_TRUE(device->SubmitCopy(std::move(request), done.Callback()).ok());

  // An unrelated copy is not held up by the waiting one.
  Completion other;
  ASSERT_TRUE(device->SubmitCopy(OneCopy(staging->data(), arena.get(), 0), other.Callback()).ok());
  ASSERT_TRUE(other.WaitFor(std::chrono::seconds(5)));

  EXPECT_FALSE(done.WaitFor(std::chrono::milliseconds(50)));
  EXPECT_EQ(fences->ready(kSlot), 3u);
  EXPECT_TRUE(AllZero(arena->host_data() + kSlot * uint64_t{4096}, 4096));
  EXPECT_EQ(device->Drain(absl::Milliseconds(5)).code(), absl::StatusCode::kDeadlineExceeded);

  ASSERT_TRUE(client.SignalDone(kSlot, 3).ok());
  ASSERT_TRUE(done.WaitFor(std::chrono::seconds(5)));
  EXPECT_TRUE(done.status().ok()) << done.status();
  EXPECT_TRUE(client.WaitReady(kSlot, 4, absl::Seconds(1)).ok());
  EXPECT_TRUE(Matches(arena->host_data() + kSlot * uint64_t{4096}, 4096, 9));
}

// Sessions signal done in objects of their own; the table's done words, which copies wait on,
// move only when the daemon declares (after checking the session's word) or forces. A client
// that lowers its own words (here: writes them directly, as a hostile one would) has only its
// own releases refused; no copy waits on them and another session is untouched.
TEST(HostDeviceTest, SessionDoneWordsAreTheSessionsOwnAndCopiesNeverWaitOnThem) {
  auto device = NewDevice({.copy_threads = 2});
  ASSERT_TRUE(device->caps().session_fences);
  auto arena = Must(device->AllocateArena(uint64_t{4} * 4096, "fenced"));
  auto table = Must(device->CreateFences(4));
  auto a = Must(device->CreateSessionFences(*table));
  auto b = Must(device->CreateSessionFences(*table));
  EXPECT_FALSE(a->WaitsForClient());
  const FenceExport ax = Must(a->Export());
  const FenceExport bx = Must(b->Export());
  ASSERT_TRUE(ax.session_done.has_value() && bx.session_done.has_value());
  // Two objects (where handles carry no identity, two handles of the daemon's).
  if (testing::kHandlesCarryIdentity) {
    EXPECT_NE(ax.session_done->inode, bx.session_done->inode);
  } else {
    EXPECT_NE(ax.session_done->fd, bx.session_done->fd);
  }
  MappedFences client_a = Must(MapFences(ax));
  MappedFences client_b = Must(MapFences(bx));
  ASSERT_TRUE(table->AdvanceReady(0, 1).ok());
  EXPECT_EQ(client_a.ready(0), 1u);  // ready comes from the shared table

  // A release needs the session's own word.
  EXPECT_EQ(a->DeclareDone(0, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(a->Signalled(0, 1));
  ASSERT_TRUE(client_a.SignalDone(0, 1).ok());
  EXPECT_TRUE(a->Signalled(0, 1));
  EXPECT_FALSE(b->Signalled(0, 1));  // B's words are B's
  EXPECT_EQ(client_b.done(0), 0u);
  ASSERT_TRUE(a->DeclareDone(0, 1).ok());
  EXPECT_EQ(table->done(0), 1u);
  EXPECT_EQ(a->DeclareDone(0, 2).code(), absl::StatusCode::kFailedPrecondition);  // not ready
  EXPECT_EQ(a->DeclareDone(0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->DeclareDone(9, 1).code(), absl::StatusCode::kInvalidArgument);

  // A hostile client zeroes its own done words: the table keeps what the daemon declared.
  ShmMapping own = Must(MapSharedSegment(*ax.session_done, ax.segment_bytes - ax.done_offset));
  std::memset(own.data(), 0, own.bytes());
  EXPECT_EQ(client_a.done(0), 0u);
  EXPECT_EQ(table->done(0), 1u);
  EXPECT_EQ(a->DeclareDone(0, 1).code(), absl::StatusCode::kFailedPrecondition);
  // The next occupant's copy waits for done >= 1 on the table: it starts at once.
  auto staging = Must(device->AllocateStaging(4096));
  Fill(staging->data(), 5);
  CopyRequest request = OneCopy(staging->data(), arena.get(), 0, CopyPriority::kDemand);
  request.waits.push_back(FenceWait{table.get(), 0, 1});
  request.signals.push_back(FenceSignal{table.get(), 0, 2});
  Completion copied;
  ASSERT_TRUE(device->SubmitCopy(std::move(request), copied.Callback()).ok());
  ASSERT_TRUE(copied.WaitFor(std::chrono::seconds(5)));
  EXPECT_TRUE(copied.status().ok()) << copied.status();
  // B, untouched, releases as usual.
  ASSERT_TRUE(client_b.SignalDone(0, 2).ok());
  EXPECT_TRUE(b->DeclareDone(0, 2).ok());

  // A slot nobody declared: its copy waits until the daemon forces done for the session.
  ASSERT_TRUE(table->AdvanceReady(1, 1).ok());
  CopyRequest held = OneCopy(staging->data(), arena.get(), 4096, CopyPriority::kDemand);
  held.waits.push_back(FenceWait{table.get(), 1, 1});
  Completion forced;
  ASSERT_TRUE(device->SubmitCopy(std::move(held), forced.Callback()).ok());
  EXPECT_FALSE(forced.WaitFor(std::chrono::milliseconds(50)));
  ASSERT_TRUE(a->ForceDone(1, 1).ok());
  ASSERT_TRUE(forced.WaitFor(std::chrono::seconds(5)));

  // A client sleeping on ready wakes when the daemon advances it (no waiter count to trust).
  const absl::Time start = absl::Now();
  std::thread waker([&] {
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_TRUE(table->AdvanceReady(3, 1).ok());
  });
  EXPECT_TRUE(client_b.WaitReady(3, 1, absl::Seconds(10)).ok());
  waker.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(HostDeviceTest, FencesOnlyGrow) {
  auto device = NewDevice();
  auto fences = Must(device->CreateFences(3));
  MappedFences client = Must(MapFences(Must(fences->Export())));
  EXPECT_EQ(fences->size(), 3u);
  EXPECT_EQ(client.size(), 3u);
  EXPECT_EQ(fences->ready(0), 0u);
  EXPECT_EQ(client.done(0), 0u);

  ASSERT_TRUE(fences->AdvanceReady(0, 5).ok());
  EXPECT_TRUE(fences->AdvanceReady(0, 5).ok());  // equal: no-op
  EXPECT_EQ(fences->AdvanceReady(0, 4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fences->ready(0), 5u);
  EXPECT_EQ(client.ready(0), 5u);

  EXPECT_EQ(client.SignalDone(0, 6).code(), absl::StatusCode::kFailedPrecondition);  // > ready
  ASSERT_TRUE(client.SignalDone(0, 5).ok());
  EXPECT_EQ(client.SignalDone(0, 4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fences->done(0), 5u);
  EXPECT_EQ(fences->done(1), 0u);

  EXPECT_EQ(fences->AdvanceReady(3, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.SignalDone(3, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.WaitReady(3, 1, absl::Milliseconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fences->ready(7), 0u);
}

TEST(HostDeviceTest, WaitsTimeOutWithDeadlineExceeded) {
  auto device = NewDevice();
  auto fences = Must(device->CreateFences(2));
  MappedFences client = Must(MapFences(Must(fences->Export())));
  const auto start = std::chrono::steady_clock::now();
  const absl::Status ready = client.WaitReady(1, 1, absl::Milliseconds(30));
  EXPECT_EQ(ready.code(), absl::StatusCode::kDeadlineExceeded) << ready;
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));
  EXPECT_EQ(fences->WaitDone(1, 1, absl::Milliseconds(10)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(client.WaitReady(1, 1, absl::ZeroDuration()).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(client.WaitReady(1, 0, absl::ZeroDuration()).ok());
}

TEST(HostDeviceTest, WaitReadyWakesWhenAnotherThreadAdvances) {
  auto device = NewDevice();
  auto fences = Must(device->CreateFences(2));
  MappedFences client = Must(MapFences(Must(fences->Export())));
  std::thread advancer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_TRUE(fences->AdvanceReady(1, 2).ok());
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(client.WaitReady(1, 2, absl::Seconds(10)).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  advancer.join();
}

TEST(HostDeviceTest, ShutdownCallsEveryCallbackExactlyOnce) {
  auto device = NewDevice({.copy_threads = 1});
  auto arena = Must(device->AllocateArena(kMiB, "shutdown"));
  auto fences = Must(device->CreateFences(1));
  auto staging = Must(device->AllocateStaging(4096));
  constexpr int kQueued = 40;
  std::vector<std::atomic<int>> calls(kQueued + 1);
  std::vector<absl::StatusCode> codes(kQueued + 1, absl::StatusCode::kUnknown);
  std::mutex mu;
  std::promise<void> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> cancelled{0};
  auto callback = [&](int i) {
    return [&, i](const absl::Status& s) {
      if (i == 0) {
        started.set_value();
        released.wait();
      }
      {
        std::lock_guard lock(mu);
        codes[i] = s.code();
      }
      if (s.code() == absl::StatusCode::kCancelled) cancelled.fetch_add(1);
      calls[i].fetch_add(1);
    };
  };
  ASSERT_TRUE(device->SubmitCopy(OneCopy(staging->data(), arena.get(), 0), callback(0)).ok());
  started.get_future().wait();
  for (int i = 1; i <= kQueued; ++i) {
    CopyRequest r = OneCopy(staging->data(), arena.get(), 4096,
                            i % 2 ? CopyPriority::kDemand : CopyPriority::kPrefetch);
    if (i % 5 == 0) r.waits.push_back(FenceWait{fences.get(), 0, 1});  // never passes
    ASSERT_TRUE(device->SubmitCopy(std::move(r), callback(i)).ok());
  }
  // Shutdown cancels the queued copies at once, then waits for the running one to finish.
  std::thread stopper([&] { device->Shutdown(); });
  while (cancelled.load() < kQueued) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  release.set_value();
  stopper.join();
  for (int i = 0; i <= kQueued; ++i) EXPECT_EQ(calls[i].load(), 1) << i;
  EXPECT_EQ(codes[0], absl::StatusCode::kOk);
  for (int i = 1; i <= kQueued; ++i) EXPECT_EQ(codes[i], absl::StatusCode::kCancelled) << i;

  // After shutdown: refused, and the callback is never called.
  bool called = false;
  const absl::Status late = device->SubmitCopy(OneCopy(staging->data(), arena.get(), 0),
                                               [&](const absl::Status&) { called = true; });
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  device->Shutdown();  // idempotent
  EXPECT_FALSE(called);
  EXPECT_TRUE(device->Drain(absl::Seconds(1)).ok());
}

TEST(HostDeviceTest, DestroyingTheDeviceCancelsQueuedCopies) {
  auto device = NewDevice({.copy_threads = 2});
  auto arena = Must(device->AllocateArena(kMiB, "rai"));
  auto fences = Must(device->CreateFences(1));
  auto staging = Must(device->AllocateStaging(4096));
  std::atomic<int> cancelled{0};
  for (int i = 0; i < 10; ++i) {
    CopyRequest r = OneCopy(staging->data(), arena.get(), 0);
    r.waits.push_back(FenceWait{fences.get(), 0, 1});
    ASSERT_TRUE(device
                    ->SubmitCopy(std::move(r),
                                 [&](const absl::Status& s) {
                                   if (s.code() == absl::StatusCode::kCancelled) {
                                     cancelled.fetch_add(1);
                                   }
                                 })
                    .ok());
  }
  device.reset();
  EXPECT_EQ(cancelled.load(), 10);
}

TEST(HostDeviceTest, BadSizesAndRequestsAreRejected) {
  auto device = NewDevice({.max_arena_bytes = 8 * kMiB, .max_staging_bytes = 8 * kMiB});
  EXPECT_EQ(device->AllocateArena(0, "zero").status().code(), absl::StatusCode::kInvalidArgument);
  const auto big = device->AllocateArena(8 * kMiB + 1, "big");
  EXPECT_TRUE(testing::IsError(big.status(), absl::StatusCode::kResourceExhausted,
                               ErrorKind::kAbsurdCount, {"8388609", "8388608"}));
  EXPECT_EQ(device->AllocateArena(~uint64_t{0}, "absurd").status().code(),
            absl::StatusCode::kResourceExhausted);
  // The largest usable size leaves the zero tail inside the device's bound.
  EXPECT_TRUE(device->AllocateArena(8 * kMiB - kArenaMinTail, "max").ok());
  EXPECT_EQ(device->AllocateArena(8 * kMiB - kArenaMinTail + 1, "over").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(device->AllocateStaging(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->AllocateStaging(9 * kMiB).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(device->CreateFences(0).status().code(), absl::StatusCode::kInvalidArgument);

  auto arena = Must(device->AllocateArena(4096, "small"));
  auto staging = Must(device->AllocateStaging(8192));
  const auto rejected = [&](CopyRequest r) {
    bool called = false;
    const absl::Status s =
        device->SubmitCopy(std::move(r), [&](const absl::Status&) { called = true; });
    EXPECT_FALSE(called);
    return s.code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(rejected(CopyRequest{}));
  EXPECT_TRUE(rejected(OneCopy(staging->data(), arena.get(), 0)));  // 8192 > 4096 usable bytes
  EXPECT_TRUE(rejected(OneCopy(staging->data().first(16), arena.get(), 4090)));
  EXPECT_TRUE(rejected(OneCopy(staging->data().first(0), arena.get(), 0)));
  auto fences = Must(device->CreateFences(2));
  CopyRequest bad_slot = OneCopy(staging->data().first(16), arena.get(), 0);
  bad_slot.waits.push_back(FenceWait{fences.get(), 2, 1});
  EXPECT_TRUE(rejected(std::move(bad_slot)));
  // Objects of another device.
  auto other = NewDevice();
  auto foreign = Must(other->AllocateArena(4096, "foreign"));
  EXPECT_TRUE(rejected(OneCopy(staging->data().first(16), foreign.get(), 0)));

  EXPECT_EQ(MakeHostDevice({.copy_threads = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeHostDevice({.shm_prefix = "a/b"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostDeviceTest, MappingErrorsNameTheCallAndObject) {
  ArenaExport missing;
  missing.handle.shm_name = testing::MissingShmName();
  missing.bytes = kMiB;
  missing.reserved_bytes = 2 * kMiB;
  const auto arena = MapArena(missing);
  EXPECT_TRUE(testing::IsError(
      arena.status(), absl::StatusCode::kNotFound, ErrorKind::kIo,
      {testing::kOpenByNameCall, testing::MissingShmName(), testing::kNoSuchObjectText}));
  missing.reserved_bytes = kMiB;  // not a multiple of 2 MiB
  EXPECT_EQ(MapArena(missing).status().code(), absl::StatusCode::kInvalidArgument);

  // A descriptor larger than the object it names.
  auto device = NewDevice();
  auto real = Must(device->AllocateArena(kMiB, "small"));
  ArenaExport lying = Must(real->Export());
  lying.bytes = lying.reserved_bytes = 4 * kMiB;
  EXPECT_EQ(MapArena(lying).status().code(), absl::StatusCode::kInvalidArgument);
  // A descriptor whose object was replaced (another inode behind the name), where handles
  // carry an identity (Windows names end in 64 random bits instead).
  if (testing::kHandlesCarryIdentity) {
    ArenaExport replaced = Must(real->Export());
    replaced.handle.inode += 1;
    EXPECT_TRUE(testing::IsError(MapArena(replaced).status(), absl::StatusCode::kNotFound,
                                 ErrorKind::kMissingFile, {"no longer the one exported"}));
  }
  // A fence descriptor pointing at an arena.
  FenceExport not_fences;
  not_fences.handle = lying.handle;
  not_fences.n_slots = 1;
  const host_device_internal::FenceLayout layout = host_device_internal::LayoutFor(1);
  not_fences.done_offset = layout.done_offset;
  not_fences.segment_bytes = layout.segment_bytes;
  EXPECT_EQ(MapFences(not_fences).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostDeviceTest, RegisteredHostMemoryIsAStagingSource) {
  auto device = NewDevice();
  ASSERT_TRUE(device->caps().registers_host_memory);
  std::vector<uint8_t> pack(8192);
  Fill(pack, 5);
  auto staging = Must(device->RegisterHostMemory(pack));
  EXPECT_EQ(staging->data().data(), pack.data());
  auto arena = Must(device->AllocateArena(8192, "direct"));
  Completion done;
  ASSERT_TRUE(device->SubmitCopy(OneCopy(staging->data(), arena.get(), 0), done.Callback()).ok());
  ASSERT_TRUE(done.WaitFor(std::chrono::seconds(5)));
  EXPECT_TRUE(Matches(arena->host_data(), 8192, 5));
}

}  // namespace
}  // namespace expertd
