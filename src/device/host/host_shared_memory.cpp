// The host device's fence word algorithms, which both ends use, and the client side: MapArena,
// MapFences, MappedFences, shared segments. The shared-memory objects themselves are per
// platform (host_shared_memory_posix.cpp, host_shared_memory_win32.cpp).
#include "device/host/host_shared_memory.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "util/checked.h"
#include "util/futex.h"
#include "util/status.h"

namespace expertd {
namespace host_device_internal {
namespace {

// Fences live in memory several processes map at different addresses: only lock-free atomics
// are address-free (they do not depend on a per-process lock table).
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

// The futex is the 32-bit half of a counter holding its low bits: it changes on every advance
// (until a 2^32 jump between a waiter's load and its sleep, which generations never make).
uint32_t* FutexWord(uint64_t* counter) {
  return reinterpret_cast<uint32_t*>(counter) + (std::endian::native == std::endian::big ? 1 : 0);
}
}  // namespace

absl::Status CheckObjectSize(const std::string& what, uint64_t have, uint64_t need) {
  if (have >= need) return absl::OkStatus();
  return InvalidError(ErrorKind::kOutOfBounds, absl::StrCat("shared object ", what, " has ", have,
                                                            " bytes; its descriptor says ", need));
}

// ---- The daemon's objects ---------------------------------------------------------------------

SharedMemory::SharedMemory(SharedMemory&& o) noexcept
    : name_(std::exchange(o.name_, {})),
      handle_(std::move(o.handle_)),
      exported_(std::move(o.exported_)),
      map_(std::move(o.map_)),
      dev_(o.dev_),
      inode_(o.inode_) {}

SharedMemory& SharedMemory::operator=(SharedMemory&& o) noexcept {
  std::swap(name_, o.name_);
  std::swap(handle_, o.handle_);
  std::swap(exported_, o.exported_);
  std::swap(map_, o.map_);
  std::swap(dev_, o.dev_);
  std::swap(inode_, o.inode_);
  return *this;
}

// ---- Fence words -------------------------------------------------------------------------------

FenceLayout LayoutFor(uint32_t n_slots) {
  const uint64_t page = PageSize();
  const uint64_t part1 = *CheckedAlignUp(64 + uint64_t{8} * n_slots, page);
  const uint64_t part2 = *CheckedAlignUp(128 + uint64_t{8} * n_slots, page);
  return {part1, part1 + part2};
}
FenceWords WordsAt(uint8_t* part1, uint8_t* part2, uint32_t n_slots) {
  FenceWords w;
  w.ready = reinterpret_cast<uint64_t*>(part1 + 64);
  w.ready_waiters = reinterpret_cast<uint32_t*>(part2);
  w.done_waiters = reinterpret_cast<uint32_t*>(part2 + 64);
  w.done = reinterpret_cast<uint64_t*>(part2 + 128);
  w.n_slots = n_slots;
  return w;
}

uint64_t LoadCounter(const FenceWords& w, uint64_t* array, SlotId slot) {
  if (slot >= w.n_slots) return 0;
  return std::atomic_ref<uint64_t>(array[slot]).load(std::memory_order_acquire);
}

// Raises counter[slot] to `generation` (never lowers it) and wakes waiters if any (always when
// `waiters` is null: nobody counts them). The seq_cst
// store and the seq_cst load of the waiter count pair with WaitCounter's seq_cst increment and
// load: either the waiter sees the new value or the advancer sees the waiter.
absl::Status AdvanceCounter(uint64_t* array, uint32_t* waiters, SlotId slot, uint64_t generation,
                            std::string_view what) {
  std::atomic_ref<uint64_t> counter(array[slot]);
  uint64_t current = counter.load(std::memory_order_relaxed);
  do {
    if (generation < current) {
      return absl::FailedPreconditionError(absl::StrCat(AV(what), "[", slot, "] is at ", current,
                                                        "; it cannot go back to ", generation));
    }
    if (generation == current) return absl::OkStatus();
  } while (!counter.compare_exchange_weak(current, generation, std::memory_order_seq_cst,
                                          std::memory_order_relaxed));
  if (waiters == nullptr ||
      std::atomic_ref<uint32_t>(*waiters).load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(FutexWord(&array[slot]));
  }
  return absl::OkStatus();
}

// Spins up to 20 µs (a copy about to finish is cheaper to watch than to sleep on), then
// registers as a waiter and sleeps on the counter's futex until it reaches `generation`.
absl::Status WaitCounter(uint64_t* array, uint32_t* waiters, SlotId slot, uint64_t generation,
                         absl::Duration timeout, std::string_view what) {
  std::atomic_ref<uint64_t> counter(array[slot]);
  if (counter.load(std::memory_order_acquire) >= generation) return absl::OkStatus();
  const absl::Time start = absl::Now();
  const absl::Time spin_until = start + std::min(timeout, absl::Microseconds(20));
  while (absl::Now() < spin_until) {
    for (int i = 0; i < 64; ++i) CpuRelax();
    if (counter.load(std::memory_order_acquire) >= generation) return absl::OkStatus();
  }
  const absl::Time deadline = start + timeout;
  std::atomic_ref<uint32_t> waiting(*waiters);
  waiting.fetch_add(1, std::memory_order_seq_cst);
  absl::Status result;
  for (;;) {
    const uint64_t value = counter.load(std::memory_order_seq_cst);
    if (value >= generation) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      result = absl::DeadlineExceededError(
          absl::StrCat(AV(what), "[", slot, "] is at ", value, " after waiting ",
                       absl::FormatDuration(timeout), " for generation ", generation));
      break;
    }
    FutexWait(FutexWord(&array[slot]), static_cast<uint32_t>(value), left);
  }
  waiting.fetch_sub(1, std::memory_order_seq_cst);
  return result;
}

absl::Status CheckSlot(SlotId slot, uint32_t n_slots) {
  if (slot < n_slots) return absl::OkStatus();
  return InvalidError(ErrorKind::kOutOfBounds,
                      absl::StrCat("slot ", slot, " outside a fence table of ", n_slots));
}

}  // namespace host_device_internal

// ---- Client side -------------------------------------------------------------------------------

using host_device_internal::AdvanceCounter;
using host_device_internal::CheckSlot;
using host_device_internal::FenceHeader;
using host_device_internal::FenceLayout;
using host_device_internal::FenceWords;
using host_device_internal::kFenceMagic;
using host_device_internal::kFenceVersion;
using host_device_internal::kMaxFenceSlots;
using host_device_internal::LayoutFor;
using host_device_internal::LoadCounter;
using host_device_internal::OpenedShared;
using host_device_internal::OpenShared;
using host_device_internal::WaitCounter;
using host_device_internal::WordsAt;

ShmMapping::ShmMapping(ShmMapping&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

ShmMapping& ShmMapping::operator=(ShmMapping&& other) noexcept {
  std::swap(addr_, other.addr_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

absl::StatusOr<MappedArena> MapArena(const ArenaExport& descriptor) {
  if (descriptor.reserved_bytes == 0 || descriptor.reserved_bytes % kArenaAlignment != 0 ||
      descriptor.bytes == 0 || descriptor.bytes > descriptor.reserved_bytes) {
    return InvalidError(ErrorKind::kBadValue, absl::StrCat("arena descriptor '", descriptor.label,
                                                           "' with ", descriptor.bytes, " of ",
                                                           descriptor.reserved_bytes, " bytes"));
  }
  ASSIGN_OR_RETURN(const OpenedShared object,
                   OpenShared(descriptor.handle, /*writable=*/false, descriptor.reserved_bytes));
  ASSIGN_OR_RETURN(ShmMapping map, object.Map(0, descriptor.reserved_bytes, /*writable=*/false));
  return MappedArena(std::move(map), descriptor.bytes);
}

absl::StatusOr<MappedFences> MapFences(const FenceExport& descriptor) {
  if (descriptor.n_slots == 0 || descriptor.n_slots > kMaxFenceSlots) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("fence descriptor with ", descriptor.n_slots, " slots"));
  }
  const FenceLayout layout = LayoutFor(descriptor.n_slots);
  if (descriptor.done_offset != layout.done_offset ||
      descriptor.segment_bytes != layout.segment_bytes) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("fence descriptor layout ", descriptor.done_offset, "/",
                                     descriptor.segment_bytes, " differs from ", layout.done_offset,
                                     "/", layout.segment_bytes));
  }
  ShmMapping part1;
  ShmMapping part2;
  std::string what;
  const uint64_t part2_bytes = layout.segment_bytes - layout.done_offset;
  if (descriptor.session_done.has_value()) {
    // The table read-only; the session's own done words read-write.
    ASSIGN_OR_RETURN(const OpenedShared table,
                     OpenShared(descriptor.handle, /*writable=*/false, layout.segment_bytes));
    what = table.what();
    ASSIGN_OR_RETURN(part1, table.Map(0, layout.done_offset, /*writable=*/false));
    ASSIGN_OR_RETURN(const OpenedShared done,
                     OpenShared(*descriptor.session_done, /*writable=*/true, part2_bytes));
    ASSIGN_OR_RETURN(part2, done.Map(0, part2_bytes, /*writable=*/true));
  } else {
    ASSIGN_OR_RETURN(const OpenedShared table,
                     OpenShared(descriptor.handle, /*writable=*/true, layout.segment_bytes));
    what = table.what();
    ASSIGN_OR_RETURN(part1, table.Map(0, layout.done_offset, /*writable=*/false));
    ASSIGN_OR_RETURN(part2, table.Map(layout.done_offset, part2_bytes, /*writable=*/true));
  }
  FenceHeader header;
  std::memcpy(&header, part1.data(), sizeof(header));
  if (header.magic != kFenceMagic || header.version != kFenceVersion ||
      header.n_slots != descriptor.n_slots || header.done_offset != layout.done_offset) {
    return InvalidError(ErrorKind::kBadMagic,
                        absl::StrCat("shared object ", what, " is not a fence table of ",
                                     descriptor.n_slots, " slots"));
  }
  const FenceWords words = WordsAt(part1.data(), part2.data(), descriptor.n_slots);
  return MappedFences(std::move(part1), std::move(part2), words);
}

uint64_t MappedFences::ready(SlotId slot) const { return LoadCounter(words_, words_.ready, slot); }
uint64_t MappedFences::done(SlotId slot) const { return LoadCounter(words_, words_.done, slot); }

absl::Status MappedFences::WaitReady(SlotId slot, uint64_t generation,
                                     absl::Duration timeout) const {
  RETURN_IF_ERROR(CheckSlot(slot, size()));
  return WaitCounter(words_.ready, words_.ready_waiters, slot, generation, timeout, "ready");
}

absl::Status MappedFences::SignalDone(SlotId slot, uint64_t generation) {
  RETURN_IF_ERROR(CheckSlot(slot, size()));
  if (const uint64_t ready_now = ready(slot); generation > ready_now) {
    return absl::FailedPreconditionError(
        absl::StrCat("done[", slot, "] = ", generation, " but ready is only at ", ready_now));
  }
  return AdvanceCounter(words_.done, words_.done_waiters, slot, generation, "done");
}

namespace {
class SegmentImpl final : public SharedSegment {
 public:
  explicit SegmentImpl(host_device_internal::SharedMemory memory) : memory_(std::move(memory)) {}
  uint8_t* data() const override { return memory_.data(); }
  uint64_t bytes() const override { return memory_.bytes(); }
  SharedHandle handle() const override { return memory_.Handle(); }
  void Unlink() override { memory_.Unlink(); }

 private:
  host_device_internal::SharedMemory memory_;
};
}  // namespace

absl::StatusOr<std::unique_ptr<SharedSegment>> CreateSharedSegment(const HostDeviceOptions& options,
                                                                   std::string_view label,
                                                                   uint64_t bytes) {
  ASSIGN_OR_RETURN(host_device_internal::SharedMemory memory,
                   host_device_internal::SharedMemory::Create(options, label, bytes));
  return std::unique_ptr<SharedSegment>(new SegmentImpl(std::move(memory)));
}

absl::StatusOr<ShmMapping> MapSharedSegment(const SharedHandle& handle, uint64_t bytes) {
  ASSIGN_OR_RETURN(const OpenedShared object, OpenShared(handle, /*writable=*/true, bytes));
  return object.Map(0, bytes, /*writable=*/true);
}

}  // namespace expertd
