// The CUDA backend's logic that needs no GPU: sticky error classification, registration
// chunking and fallback choice, the pinned budget, IPC event generation bookkeeping (the
// never-recorded-event trap), and the IPC handle layout in export descriptors.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "device/cuda/cuda_errors.h"
#include "device/cuda/event_generations.h"
#include "device/cuda/ipc_layout.h"
#include "device/cuda/registration_plan.h"
#include "device/device.h"

namespace expertd::cuda {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kMiB = uint64_t{1} << 20;

// ---- Errors ----------------------------------------------------------------------------------

TEST(CudaErrors, StickyErrorsAreTheContextCorruptingOnes) {
  for (int e :
       {code::kIllegalAddress, code::kLaunchFailure, code::kHardwareStackError,
        code::kIllegalInstruction, code::kMisalignedAddress, code::kInvalidAddressSpace,
        code::kInvalidPc, code::kEccUncorrectable, code::kUnknown, code::kLaunchTimeout,
        code::kAssert, code::kContained, code::kTensorMemoryLeak, code::kMpsClientTerminated,
        code::kExternalDevice, code::kNvlinkUncorrectable, code::kContextIsDestroyed}) {
    EXPECT_TRUE(IsStickyCudaError(e)) << e;
    EXPECT_EQ(StatusCodeForCudaError(e), absl::StatusCode::kInternal) << e;
  }
  for (int e : {code::kSuccess, code::kInvalidValue, code::kMemoryAllocation, code::kNotReady,
                code::kNoDevice, code::kInsufficientDriver, code::kDevicesUnavailable,
                code::kHostMemoryAlreadyRegistered, code::kNotSupported, 12345}) {
    EXPECT_FALSE(IsStickyCudaError(e)) << e;
  }
}

TEST(CudaErrors, StatusCodes) {
  EXPECT_EQ(StatusCodeForCudaError(code::kSuccess), absl::StatusCode::kOk);
  EXPECT_EQ(StatusCodeForCudaError(code::kMemoryAllocation), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusCodeForCudaError(code::kInvalidValue), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StatusCodeForCudaError(code::kInsufficientDriver), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatusCodeForCudaError(code::kNoDevice), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatusCodeForCudaError(code::kDevicesUnavailable), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatusCodeForCudaError(code::kNotSupported), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(StatusCodeForCudaError(code::kNotPermitted), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(StatusCodeForCudaError(code::kHostMemoryAlreadyRegistered),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(StatusCodeForCudaError(4242), absl::StatusCode::kInternal);
}

TEST(CudaErrors, MessageNamesExpressionPlaceAndError) {
  const absl::Status st = MakeCudaError(code::kIllegalAddress, "cudaErrorIllegalAddress",
                                        "an illegal memory access was encountered",
                                        "cudaMemcpyAsync(dst, src, n, kind, s)", "x.cpp", 42);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  for (const char* needle : {"cudaMemcpyAsync(dst, src, n, kind, s)", "x.cpp:42",
                             "cudaErrorIllegalAddress", "illegal memory access", "restart"}) {
    EXPECT_NE(st.message().find(needle), absl::string_view::npos) << needle << ": " << st;
  }
  EXPECT_EQ(CudaErrorCodeOf(st), code::kIllegalAddress);
  EXPECT_TRUE(IsStickyCudaStatus(st));
  EXPECT_FALSE(CudaErrorCodeOf(absl::InternalError("plain")).has_value());
  EXPECT_FALSE(IsStickyCudaStatus(absl::OkStatus()));
}

TEST(CudaErrors, AnnotateKeepsCodeAndPayload) {
  const absl::Status st = MakeCudaError(code::kMemoryAllocation, "cudaErrorMemoryAllocation",
                                        "out of memory", "cudaMalloc(&p, n)", "y.cpp", 7);
  const absl::Status a = Annotate(st, "arena 'L3' of 2097152 bytes");
  EXPECT_EQ(a.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaErrorCodeOf(a), code::kMemoryAllocation);
  EXPECT_EQ(a.message().substr(0, 20), "arena 'L3' of 209715");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

TEST(CudaErrors, LatchKeepsTheFirstStickyErrorOnly) {
  StickyErrorLatch latch;
  EXPECT_TRUE(latch.Get().ok());
  const absl::Status oom =
      MakeCudaError(code::kMemoryAllocation, "oom", "out of memory", "cudaMalloc", "f", 1);
  EXPECT_EQ(latch.Observe(oom), oom);  // returned unchanged, not latched
  EXPECT_FALSE(latch.tripped());
  const absl::Status first =
      MakeCudaError(code::kIllegalAddress, "ill", "illegal address", "first", "f", 2);
  const absl::Status second = MakeCudaError(code::kLaunchFailure, "lf", "launch", "second", "f", 3);
  EXPECT_EQ(latch.Observe(first), first);
  EXPECT_EQ(latch.Observe(second), second);
  EXPECT_TRUE(latch.tripped());
  EXPECT_EQ(latch.Get(), first);
}

TEST(CudaErrors, LatchIsThreadSafe) {
  StickyErrorLatch latch;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&latch, t] {
      for (int i = 0; i < 1000; ++i) {
        (void)latch.Observe(
            MakeCudaError(code::kIllegalAddress, "ill", "x", "e", "f", t * 1000 + i));
        (void)latch.Get();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(latch.tripped());
  EXPECT_EQ(CudaErrorCodeOf(latch.Get()), code::kIllegalAddress);
}

// ---- Registration plan ----------------------------------------------------------------------

TEST(RegistrationPlan, AlignedRangeInWholeChunks) {
  const auto plan = PlanRegistration(0x100000, 4 * kMiB, kPage, kMiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ((*plan)[i], (HostRange{0x100000 + i * kMiB, kMiB}));
  }
}

TEST(RegistrationPlan, UnalignedRangeIsWidenedToPagesAndLastChunkIsPartial) {
  const uint64_t address = 0x10000 + 100;  // mid-page
  const uint64_t bytes = 2 * kMiB + 5000;  // ends mid-page too
  const auto plan = PlanRegistration(address, bytes, kPage, kMiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const uint64_t start = 0x10000;
  const uint64_t end = ((address + bytes + kPage - 1) / kPage) * kPage;
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_EQ(plan->front().address, start);
  uint64_t at = start;
  for (const HostRange& c : *plan) {
    EXPECT_EQ(c.address, at);
    EXPECT_EQ(c.address % kPage, 0u);
    EXPECT_EQ(c.bytes % kPage, 0u);
    EXPECT_LE(c.bytes, kMiB);
    at += c.bytes;
  }
  EXPECT_EQ(at, end);
  EXPECT_EQ(plan->back().bytes, end - start - 2 * kMiB);
}

TEST(RegistrationPlan, SmallRangeIsOneChunkOfOnePage) {
  const auto plan = PlanRegistration(0x7000 + 1, 10, kPage, kMiB);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_EQ(plan->front(), (HostRange{0x7000, kPage}));
  // A range crossing a page boundary covers both pages.
  const auto two = PlanRegistration(0x7000 + kPage - 1, 2, kPage, kMiB);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->front(), (HostRange{0x7000, 2 * kPage}));
}

TEST(RegistrationPlan, RejectsBadInput) {
  EXPECT_EQ(PlanRegistration(0x1000, 0, kPage, kMiB).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PlanRegistration(0x1000, 10, 3000, kMiB).ok());        // page not a power of 2
  EXPECT_FALSE(PlanRegistration(0x1000, 10, kPage, 0).ok());          // no chunk
  EXPECT_FALSE(PlanRegistration(0x1000, 10, kPage, kPage + 1).ok());  // chunk not page multiple
  EXPECT_FALSE(PlanRegistration(UINT64_MAX - 10, 100, kPage, kMiB).ok());       // end overflows
  EXPECT_FALSE(PlanRegistration(UINT64_MAX - kPage + 2, 1, kPage, kMiB).ok());  // align overflows
  const auto too_many = PlanRegistration(0, 100 * kPage, kPage, kPage, /*max_chunks=*/99);
  EXPECT_FALSE(too_many.ok());
  EXPECT_TRUE(PlanRegistration(0, 100 * kPage, kPage, kPage, /*max_chunks=*/100).ok());
}

TEST(RegistrationPlan, ModeFromProbe) {
  HostRegisterProbe p;
  p.device_supports_register = true;
  p.device_supports_read_only = true;
  EXPECT_EQ(ChooseRegistrationMode(p).mode, RegistrationMode::kReadOnly);
  p.device_supports_read_only = false;
  EXPECT_EQ(ChooseRegistrationMode(p).mode, RegistrationMode::kReadWrite);
  EXPECT_NE(ChooseRegistrationMode(p).reason.find("read-only"), std::string::npos);
  p.device_supports_register = false;
  p.device_supports_read_only = true;  // meaningless without registration
  EXPECT_EQ(ChooseRegistrationMode(p).mode, RegistrationMode::kUnsupported);
  p.device_supports_register = true;
  p.allowed = false;
  const RegistrationChoice off = ChooseRegistrationMode(p);
  EXPECT_EQ(off.mode, RegistrationMode::kUnsupported);
  EXPECT_NE(off.reason.find("configuration"), std::string::npos);
  EXPECT_EQ(RegistrationModeName(RegistrationMode::kReadOnly), "registered-read-only");
}

TEST(RegistrationPlan, FailuresFallBackUnlessSticky) {
  for (int e : {code::kNotSupported, code::kInvalidValue, code::kHostMemoryAlreadyRegistered,
                code::kMemoryAllocation, code::kOperatingSystem, code::kNotPermitted}) {
    EXPECT_EQ(ClassifyRegistrationFailure(e), RegistrationFailure::kFallBack) << e;
  }
  for (int e : {code::kIllegalAddress, code::kUnknown, code::kEccUncorrectable}) {
    EXPECT_EQ(ClassifyRegistrationFailure(e), RegistrationFailure::kPropagate) << e;
  }
}

TEST(PinnedBudget, ReservesWithinTheLimit) {
  PinnedBudget budget(10 * kMiB);
  EXPECT_TRUE(budget.Reserve(6 * kMiB, "staging").ok());
  const absl::Status over = budget.Reserve(5 * kMiB, "registration");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("registration"), absl::string_view::npos);
  EXPECT_EQ(budget.used(), 6 * kMiB);  // a refused request takes nothing
  EXPECT_TRUE(budget.Reserve(4 * kMiB, "staging").ok());
  budget.Release(6 * kMiB);
  EXPECT_EQ(budget.used(), 4 * kMiB);
  EXPECT_FALSE(budget.Reserve(UINT64_MAX, "huge").ok());  // overflow is refused too
}

TEST(PinnedBudget, ConcurrentReservationsNeverExceedTheLimit) {
  PinnedBudget budget(1000);
  std::vector<std::thread> threads;
  std::atomic<int> granted{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        if (budget.Reserve(1, "x").ok()) ++granted;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(granted.load(), 1000);
  EXPECT_EQ(budget.used(), 1000u);
}

// ---- Event generations -----------------------------------------------------------------------

TEST(EventGenerations, NeverRecordedDoneEventIsNotTrusted) {
  EventGenerations g(4);
  ASSERT_TRUE(g.BeginReadyRecord(1, 1).ok());
  // The slot was granted at generation 1; the client has not declared done: a copy that
  // overwrites it must hold on the CPU (waiting on the never-recorded done event would pass).
  EXPECT_EQ(g.ForWait(1, 1), WaitAction::kNotDeclared);
  EXPECT_EQ(g.done(1), 0u);
  ASSERT_TRUE(g.DeclareDoneRecorded(1, 1).ok());
  EXPECT_EQ(g.ForWait(1, 1), WaitAction::kWaitDoneEvent);
  EXPECT_EQ(g.done(1), 1u);
  EXPECT_EQ(g.ForWait(1, 0), WaitAction::kNone);  // first occupant: nothing to wait for
}

TEST(EventGenerations, ADeclarationForAnOlderGrantDoesNotCoverANewerOne) {
  EventGenerations g(2);
  ASSERT_TRUE(g.BeginReadyRecord(0, 1).ok());
  ASSERT_TRUE(g.AdvanceReady(0, 2).ok());  // re-granted while resident
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 1).ok());
  // The latest done record belongs to generation 1; generation 2's reader has not declared.
  EXPECT_EQ(g.ForWait(0, 2), WaitAction::kNotDeclared);
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 2).ok());
  EXPECT_EQ(g.ForWait(0, 2), WaitAction::kWaitDoneEvent);
}

TEST(EventGenerations, GenerationsOnlyGrowAndStaleDeclarationsAreIgnored) {
  EventGenerations g(1);
  ASSERT_TRUE(g.BeginReadyRecord(0, 5).ok());
  EXPECT_EQ(g.BeginReadyRecord(0, 4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(g.AdvanceReady(0, 3).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(g.ready(0), 5u);
  EXPECT_TRUE(g.AdvanceReady(0, 5).ok());      // equal: no-op
  EXPECT_TRUE(g.BeginReadyRecord(0, 5).ok());  // equal: records again
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 5).ok());
  EXPECT_TRUE(g.DeclareDoneRecorded(0, 3).ok());  // a stale release: ignored
  EXPECT_EQ(g.done(0), 5u);
  EXPECT_EQ(g.ForWait(0, 5), WaitAction::kWaitDoneEvent);
}

TEST(EventGenerations, DeclarationsAreChecked) {
  EventGenerations g(2);
  ASSERT_TRUE(g.BeginReadyRecord(0, 3).ok());
  EXPECT_EQ(g.DeclareDoneRecorded(0, 4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(g.DeclareDoneRecorded(0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.DeclareDoneRecorded(2, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.DeclareDoneForced(1, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(g.BeginReadyRecord(7, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.ForWait(7, 1), WaitAction::kNotDeclared);
  EXPECT_EQ(g.done(0), 0u);
  EXPECT_EQ(g.ready(9), 0u);
}

TEST(EventGenerations, AGoneClientNeedsNoWait) {
  EventGenerations g(1);
  ASSERT_TRUE(g.BeginReadyRecord(0, 2).ok());
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 1).ok());
  ASSERT_TRUE(g.DeclareDoneForced(0, 2).ok());
  EXPECT_EQ(g.ForWait(0, 2), WaitAction::kNone);
  EXPECT_EQ(g.ForWait(0, 1), WaitAction::kNone);
  EXPECT_EQ(g.done(0), 2u);
}

TEST(EventGenerations, ReadyRecordedIsTracked) {
  EventGenerations g(2);
  EXPECT_FALSE(g.ready_recorded(0));
  ASSERT_TRUE(g.AdvanceReady(0, 1).ok());
  EXPECT_FALSE(g.ready_recorded(0));  // a re-grant makes no record
  ASSERT_TRUE(g.BeginReadyRecord(0, 2).ok());
  EXPECT_TRUE(g.ready_recorded(0));
  EXPECT_FALSE(g.ready_recorded(5));
}

TEST(EventGenerations, ACopyWaitsForEverySessionThatReadTheSlot) {
  EventGenerations g(2);
  ASSERT_TRUE(g.BeginReadyRecord(0, 1).ok());
  // Sessions 3 and 7 both read generation 1 of slot 0; each records its own event.
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 1, 7).ok());
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 1, 3).ok());
  EXPECT_EQ(g.ForWait(0, 1), WaitAction::kWaitDoneEvent);
  EXPECT_EQ(g.WaitSources(0), (std::vector<uint64_t>{3, 7}));
  EXPECT_TRUE(g.WaitSources(1).empty());
  // A second declaration by one session replaces its first (its records are chained).
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 1, 3).ok());
  EXPECT_EQ(g.WaitSources(0).size(), 2u);
  EXPECT_EQ(g.DeclarationsOf(3), 1u);
}

TEST(EventGenerations, TheNextReadyRecordClearsWhatItsCopyWaitedFor) {
  EventGenerations g(1);
  ASSERT_TRUE(g.BeginReadyRecord(0, 1).ok());
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 1, 5).ok());
  // The same generation recorded again keeps the declaration (it was not waited on).
  ASSERT_TRUE(g.BeginReadyRecord(0, 1).ok());
  EXPECT_EQ(g.WaitSources(0), (std::vector<uint64_t>{5}));
  // The next occupant's copy waited on session 5 before its ready record.
  EXPECT_EQ(g.DeclarationsOf(5), 1u);
  ASSERT_TRUE(g.BeginReadyRecord(0, 2).ok());
  EXPECT_TRUE(g.WaitSources(0).empty());
  EXPECT_EQ(g.DeclarationsOf(5), 0u);
  EXPECT_EQ(g.ForWait(0, 2), WaitAction::kNotDeclared);  // nobody declared generation 2 yet
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 2, 9).ok());
  EXPECT_EQ(g.WaitSources(0), (std::vector<uint64_t>{9}));
}

TEST(EventGenerations, AGoneSessionIsNotWaitedForButOthersStillAre) {
  EventGenerations g(3);
  ASSERT_TRUE(g.BeginReadyRecord(0, 4).ok());
  ASSERT_TRUE(g.BeginReadyRecord(1, 4).ok());
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 4, 1).ok());
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 4, 2).ok());
  ASSERT_TRUE(g.DeclareDoneRecorded(1, 4, 2).ok());
  // Session 1's lease was reclaimed: slot 0 still waits for session 2.
  ASSERT_TRUE(g.DeclareDoneForced(0, 4, 1).ok());
  EXPECT_EQ(g.ForWait(0, 4), WaitAction::kWaitDoneEvent);
  EXPECT_EQ(g.WaitSources(0), (std::vector<uint64_t>{2}));
  // Session 2's process exited: nothing of it is waited on, anywhere.
  EXPECT_EQ(g.DropSource(2), 2u);
  EXPECT_EQ(g.ForWait(0, 4), WaitAction::kNone);
  EXPECT_EQ(g.ForWait(1, 4), WaitAction::kNone);  // declared, no event left to wait on
  EXPECT_EQ(g.DeclarationsOf(2), 0u);
  EXPECT_EQ(g.DropSource(2), 0u);
}

TEST(ClientGenerations, DoneOnlyForWhatWasWaitedFor) {
  ClientGenerations c(3);
  EXPECT_EQ(c.OnRecordDone(0, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.OnWaitReady(0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.OnWaitReady(3, 1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c.OnWaitReady(0, 4).ok());
  EXPECT_TRUE(c.OnRecordDone(0, 4).ok());
  EXPECT_TRUE(c.OnRecordDone(0, 2).ok());  // an older lease of the same slot finishing later
  EXPECT_EQ(c.OnRecordDone(0, 5).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.OnRecordDone(0, 0).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c.OnWaitReady(0, 3).ok());  // waits never lower what was waited for
  EXPECT_TRUE(c.OnRecordDone(0, 4).ok());
}

// ---- IPC layout ------------------------------------------------------------------------------

IpcHandleBytes Handle(uint8_t seed) {
  IpcHandleBytes h{};
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<char>(seed * 7 + i);
  return h;
}

TEST(IpcLayout, ArenaRoundTrip) {
  const ArenaExport e = MakeArenaExport(Handle(3), 1000, 2 * kMiB, "L1.up", 1234);
  EXPECT_EQ(e.handle.kind, SharedHandle::Kind::kCudaIpc);
  EXPECT_EQ(e.handle.ipc_handle.size(), kIpcHandleBytes);
  EXPECT_EQ(e.handle.owner_pid, 1234);
  ASSERT_TRUE(CheckArenaExport(e).ok());
  EXPECT_EQ(ArenaHandleOf(e), Handle(3));
  ArenaExport bad = e;
  bad.handle.ipc_handle.pop_back();
  EXPECT_FALSE(CheckArenaExport(bad).ok());
  bad = e;
  bad.reserved_bytes = 3 * kMiB;
  EXPECT_FALSE(CheckArenaExport(bad).ok());
  bad = e;
  bad.bytes = 0;
  EXPECT_FALSE(CheckArenaExport(bad).ok());
  bad = e;
  bad.handle.kind = SharedHandle::Kind::kHostShm;
  EXPECT_FALSE(CheckArenaExport(bad).ok());
}

TEST(IpcLayout, FenceRoundTripAndByteLayout) {
  std::vector<IpcHandleBytes> ready;
  std::vector<IpcHandleBytes> done;
  for (uint8_t i = 0; i < 5; ++i) {
    ready.push_back(Handle(i));
    done.push_back(Handle(100 + i));
  }
  const auto e = MakeFenceExport(ready, done, 77);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->n_slots, 5u);
  EXPECT_EQ(e->done_offset, 5 * kIpcHandleBytes);
  EXPECT_EQ(e->segment_bytes, 10 * kIpcHandleBytes);
  EXPECT_EQ(e->handle.ipc_handle.size(), 10 * kIpcHandleBytes);
  ASSERT_TRUE(CheckFenceExport(*e).ok());
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(ReadyHandleOf(*e, i), ready[i]);
    EXPECT_EQ(DoneHandleOf(*e, i), done[i]);
    // The documented layout: ready handles first, then done handles, 64 bytes each.
    EXPECT_EQ(e->handle.ipc_handle.substr(i * 64, 64), std::string(ready[i].data(), 64));
    EXPECT_EQ(e->handle.ipc_handle.substr(5 * 64 + i * 64, 64), std::string(done[i].data(), 64));
  }
}

TEST(IpcLayout, FenceExportsAreChecked) {
  const std::vector<IpcHandleBytes> one{Handle(1)};
  const std::vector<IpcHandleBytes> two{Handle(1), Handle(2)};
  EXPECT_FALSE(MakeFenceExport(one, two, 1).ok());
  EXPECT_FALSE(MakeFenceExport({}, {}, 1).ok());
  auto e = MakeFenceExport(two, two, 1);
  ASSERT_TRUE(e.ok());
  FenceExport bad = *e;
  bad.n_slots = 3;
  EXPECT_FALSE(CheckFenceExport(bad).ok());
  bad = *e;
  bad.done_offset += 1;
  EXPECT_FALSE(CheckFenceExport(bad).ok());
  bad = *e;
  bad.handle.ipc_handle.push_back('x');
  EXPECT_FALSE(CheckFenceExport(bad).ok());
  bad = *e;
  bad.handle.kind = SharedHandle::Kind::kHostShm;
  EXPECT_FALSE(CheckFenceExport(bad).ok());
}


TEST(CopyStreams, CappedAtTheHardwareQueues) {
  // CUDA's default of 8 connections when the variable is unset or not a positive number.
  EXPECT_EQ(CapCopyStreams(2, "").streams, 2u);
  EXPECT_TRUE(CapCopyStreams(2, "").note.empty());
  EXPECT_EQ(CapCopyStreams(8, "").streams, 8u);
  const StreamCap capped = CapCopyStreams(16, "");
  EXPECT_EQ(capped.streams, 8u);
  EXPECT_NE(capped.note.find("capped at 8"), std::string::npos) << capped.note;
  EXPECT_EQ(CapCopyStreams(16, "junk").streams, 8u);
  EXPECT_EQ(CapCopyStreams(16, "0").streams, 8u);
  // The variable's value, at most CUDA's bound of 32.
  EXPECT_EQ(CapCopyStreams(16, "4").streams, 4u);
  EXPECT_NE(CapCopyStreams(16, "4").note.find("CUDA_DEVICE_MAX_CONNECTIONS=4"), std::string::npos);
  EXPECT_EQ(CapCopyStreams(16, "32").streams, 16u);
  EXPECT_EQ(CapCopyStreams(40, "64").streams, 32u);
}

TEST(IpcLayout, GpuUuidPrintsAsNvidiaSmiDoes) {
  const std::array<uint8_t, 16> bytes = {0x8f, 0x2c, 0x1a, 0x07, 0x00, 0xff, 0x10, 0x20,
                                         0xab, 0xcd, 0x01, 0x23, 0x45, 0x67, 0x89, 0x0e};
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-8f2c1a07-00ff-1020-abcd-01234567890e");
}

TEST(EventGenerations, ADeclarationKeepsTheTimeOfItsNewestGeneration) {
  EventGenerations g(2);
  ASSERT_TRUE(g.BeginReadyRecord(0, 3).ok());
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 2, /*source=*/5, /*now=*/100).ok());
  ASSERT_EQ(g.WaitDeclarations(0).size(), 1u);
  EXPECT_EQ(g.WaitDeclarations(0)[0].source, 5u);
  EXPECT_EQ(g.WaitDeclarations(0)[0].declared_at, 100);
  // A stale declaration changes nothing, a newer generation restarts the clock.
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 1, 5, 200).ok());
  EXPECT_EQ(g.WaitDeclarations(0)[0].declared_at, 100);
  ASSERT_TRUE(g.DeclareDoneRecorded(0, 3, 5, 300).ok());
  EXPECT_EQ(g.WaitDeclarations(0)[0].declared_at, 300);
  // Dropping the source (given up on) leaves nothing to wait for.
  EXPECT_EQ(g.DropSource(5), 1u);
  EXPECT_TRUE(g.WaitDeclarations(0).empty());
  EXPECT_EQ(g.ForWait(0, 3), WaitAction::kNone);
}

}  // namespace
}  // namespace expertd::cuda
