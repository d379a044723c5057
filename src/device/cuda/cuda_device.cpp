// The CUDA device: cudaMalloc arenas with IPC memory handles, cudaHostAlloc staging,
// cudaHostRegister of mapped ranges, IPC-event fence tables and the copy engine
// (cuda_copy_engine.h). See docs/device.md, "The CUDA device".
#include "device/cuda/cuda_device.h"

#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_client.h"
#include "device/cuda/cuda_copy_engine.h"
#include "device/cuda/cuda_objects.h"
#include "device/cuda/registration_plan.h"
#include "util/checked.h"
#include "util/status.h"

namespace expertd::cuda {
namespace {

uint64_t PageBytes() { return static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)); }

uint64_t PhysicalMemory() { return static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * PageBytes(); }

absl::Status Foreign(std::string_view what) {
  return InvalidError(ErrorKind::kBadValue,
                      absl::StrCat("copy names a ", AV(what), " of another device"));
}

absl::Status CheckOptions(const CudaDeviceOptions& o) {
  std::string bad;
  if (o.ordinal < 0) bad = absl::StrCat("ordinal ", o.ordinal);
  if (o.copy_streams == 0 || o.copy_streams > 16) {
    bad = absl::StrCat("copy_streams ", o.copy_streams, " outside 1..16");
  }
  if (o.prefetch_copies_in_flight == 0 || o.prefetch_copies_in_flight > 64) {
    bad = absl::StrCat("prefetch_copies_in_flight ", o.prefetch_copies_in_flight, " outside 1..64");
  }
  if (o.register_chunk_bytes == 0 || o.register_chunk_bytes % PageBytes() != 0) {
    bad = absl::StrCat("register_chunk_bytes ", o.register_chunk_bytes,
                       " is not a positive multiple of the page size ", PageBytes());
  }
  if (o.max_ipc_events == 0) bad = "max_ipc_events 0 (at least one fence table needs 2)";
  if (o.completion_poll_interval <= absl::ZeroDuration() ||
      o.shutdown_timeout < absl::ZeroDuration() || o.done_record_timeout <= absl::ZeroDuration()) {
    bad = "completion_poll_interval and done_record_timeout must be > 0, shutdown_timeout >= 0";
  }
  if (bad.empty()) return absl::OkStatus();
  return InvalidError(ErrorKind::kBadValue, absl::StrCat("cuda device: ", bad));
}

class CudaDevice final : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Create(const CudaDeviceOptions& options);
  ~CudaDevice() override { Shutdown(); }

  std::string_view name() const override { return name_; }
  const Capabilities& caps() const override { return caps_; }
  std::string hardware_id() const override { return uuid_; }
  std::string notes() const override { return notes_; }
  uint32_t fence_objects_in_use() const override { return ctx_->ipc_events.in_use(); }
  absl::Status Health() const override { return ctx_->latch.Get(); }

  absl::StatusOr<std::unique_ptr<Arena>> AllocateArena(uint64_t bytes,
                                                       std::string_view label) override;
  absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(uint64_t bytes) override;
  absl::StatusOr<std::unique_ptr<StagingBuffer>> RegisterHostMemory(
      std::span<uint8_t> memory) override;
  absl::StatusOr<std::unique_ptr<FenceTable>> CreateFences(uint32_t n_slots) override {
    CudaCopyEngine* engine = engine_.get();
    ASSIGN_OR_RETURN(std::unique_ptr<CudaFenceTable> table,
                     CudaFenceTable::Create(ctx_.get(), n_slots, [engine] { engine->Kick(); }));
    return table;
  }
  absl::StatusOr<std::unique_ptr<SessionFences>> CreateSessionFences(FenceTable& shared) override {
    auto* table = dynamic_cast<CudaFenceTable*>(&shared);
    if (table == nullptr || table->owner() != ctx_.get()) {
      return InvalidError(ErrorKind::kBadValue,
                          absl::StrCat("session fences over a fence table that is not ", name_,
                                       "'s"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<CudaSessionFences> fences,
                     CudaSessionFences::Create(ctx_.get(), *table));
    return fences;
  }
  absl::Status SubmitCopy(CopyRequest request, CopyCallback on_complete) override;
  absl::Status Drain(absl::Duration timeout) override { return engine_->Drain(timeout); }
  void Shutdown() override {
    if (engine_ != nullptr) engine_->Shutdown();
  }
  absl::Status ReadArena(const Arena& arena, uint64_t offset, std::span<uint8_t> out) override;

 private:
  CudaDevice() = default;

  // Declared first: destroyed last, after the engine (its streams and events need the context).
  std::unique_ptr<DeviceContext> ctx_;
  std::unique_ptr<CudaCopyEngine> engine_;
  Capabilities caps_;
  RegistrationChoice registration_;
  std::string name_;
  std::string uuid_;
  std::string notes_;
  uint64_t chunk_bytes_ = 0;
};

absl::StatusOr<std::unique_ptr<Device>> CudaDevice::Create(const CudaDeviceOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  int count = 0;
  if (absl::Status st = EXPERTD_CUDA_STATUS(cudaGetDeviceCount(&count)); !st.ok()) {
    return Annotate(st, "cuda device: no usable driver");
  }
  if (options.ordinal >= count) {
    return InvalidError(ErrorKind::kBadValue, absl::StrCat("cuda device: ordinal ", options.ordinal,
                                                           " but ", count, " GPU(s) are visible"));
  }
  std::unique_ptr<CudaDevice> d(new CudaDevice());
  const uint64_t pinned_limit =
      options.max_staging_bytes != 0 ? options.max_staging_bytes : PhysicalMemory() / 2;
  d->ctx_ = std::make_unique<DeviceContext>(options.ordinal, pinned_limit,
                                            ProcessIpcEventBudget(options.max_ipc_events));
  DeviceContext& ctx = *d->ctx_;
  RETURN_IF_ERROR(Annotate(ctx.Use(), absl::StrCat("cuda device ", options.ordinal)));

  HostRegisterProbe probe;
  probe.allowed = options.allow_host_register;
  int attr = 0;
  EXPERTD_CUDA_RETURN_IF_ERROR(
      ctx.latch, cudaDeviceGetAttribute(&attr, cudaDevAttrHostRegisterSupported, options.ordinal));
  probe.device_supports_register = attr != 0;
  EXPERTD_CUDA_RETURN_IF_ERROR(
      ctx.latch,
      cudaDeviceGetAttribute(&attr, cudaDevAttrHostRegisterReadOnlySupported, options.ordinal));
  probe.device_supports_read_only = attr != 0;
  d->registration_ = ChooseRegistrationMode(probe);
  ASSIGN_OR_RETURN(d->uuid_, DeviceUuid(options.ordinal));
  // More streams than the hardware has work queues share queues and order each other's copies.
  const StreamCap cap = CapCopyStreams(options.copy_streams, options.max_connections);

  size_t free_bytes = 0;
  size_t total_bytes = 0;
  EXPERTD_CUDA_RETURN_IF_ERROR(ctx.latch, cudaMemGetInfo(&free_bytes, &total_bytes));

  CudaCopyEngine::Options eo;
  eo.streams = cap.streams;
  eo.prefetch_in_flight = options.prefetch_copies_in_flight;
  eo.poll_interval = options.completion_poll_interval;
  eo.shutdown_timeout = options.shutdown_timeout;
  eo.done_record_timeout = options.done_record_timeout;
  ASSIGN_OR_RETURN(d->engine_, CudaCopyEngine::Create(&ctx, eo));

  Capabilities& c = d->caps_;
  c.exports_to_other_processes = true;
  c.async_copies = true;
  c.copy_priorities = cap.streams >= 2;
  c.staging_pinned = true;
  c.registers_host_memory = d->registration_.mode != RegistrationMode::kUnsupported;
  c.registers_read_only_memory = d->registration_.mode == RegistrationMode::kReadOnly;
  c.session_fences = true;
  c.copy_engines = cap.streams;
  c.max_arena_bytes = options.max_arena_bytes != 0 ? options.max_arena_bytes : total_bytes;
  c.max_staging_bytes = pinned_limit;
  c.max_fence_objects = ctx.ipc_events.limit();
  d->name_ = absl::StrCat("cuda:", options.ordinal);
  d->notes_ = absl::StrCat(d->uuid_, "; ", d->registration_.reason,
                           cap.note.empty() ? "" : "; ", cap.note);
  d->chunk_bytes_ = options.register_chunk_bytes;
  return std::unique_ptr<Device>(std::move(d));
}

absl::StatusOr<std::unique_ptr<Arena>> CudaDevice::AllocateArena(uint64_t bytes,
                                                                 std::string_view label) {
  ASSIGN_OR_RETURN(const uint64_t reserved, ArenaReservedBytes(bytes, caps_.max_arena_bytes));
  RETURN_IF_ERROR(ctx_->Use());
  const std::string what = absl::StrCat("arena '", AV(label), "' of ", reserved, " bytes");
  void* ptr = nullptr;
  if (absl::Status st = EXPERTD_CUDA_STATUS(cudaMalloc(&ptr, reserved)); !st.ok()) {
    return Annotate(ctx_->latch.Observe(st), what);
  }
  DeviceMemory memory(ptr, ctx_->ordinal);
  // Zero the whole arena (the tail padding stays zero for good) and wait: the copy streams are
  // non-blocking and would not order after the legacy stream's memset.
  absl::Status st = EXPERTD_CUDA_STATUS(cudaMemset(ptr, 0, reserved));
  if (st.ok()) st = EXPERTD_CUDA_STATUS(cudaStreamSynchronize(cudaStreamLegacy));
  if (!st.ok()) return Annotate(ctx_->latch.Observe(st), what);
  return std::make_unique<CudaArena>(ctx_.get(), std::string(label), bytes, reserved,
                                     std::move(memory));
}

absl::StatusOr<std::unique_ptr<StagingBuffer>> CudaDevice::AllocateStaging(uint64_t bytes) {
  if (bytes == 0) return InvalidError(ErrorKind::kBadValue, "staging of 0 bytes requested");
  RETURN_IF_ERROR(ctx_->pinned.Reserve(bytes, "pinned staging"));
  void* ptr = nullptr;
  absl::Status st = ctx_->Use();
  if (st.ok()) {
    st =
        ctx_->latch.Observe(EXPERTD_CUDA_STATUS(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable)));
  }
  if (!st.ok()) {
    ctx_->pinned.Release(bytes);
    return Annotate(st, absl::StrCat("pinned staging of ", bytes, " bytes"));
  }
  return std::make_unique<CudaStaging>(ctx_.get(),
                                       std::span<uint8_t>(static_cast<uint8_t*>(ptr), bytes));
}

absl::StatusOr<std::unique_ptr<StagingBuffer>> CudaDevice::RegisterHostMemory(
    std::span<uint8_t> memory) {
  if (memory.empty()) return InvalidError(ErrorKind::kBadValue, "empty host memory range");
  if (registration_.mode == RegistrationMode::kUnsupported) {
    return absl::UnimplementedError(absl::StrCat(name_, ": ", registration_.reason));
  }
  const auto address = reinterpret_cast<uintptr_t>(memory.data());
  ASSIGN_OR_RETURN(std::vector<HostRange> plan,
                   PlanRegistration(address, memory.size(), PageBytes(), chunk_bytes_));
  uint64_t pinned = 0;
  for (const HostRange& c : plan) pinned += c.bytes;
  RETURN_IF_ERROR(ctx_->pinned.Reserve(pinned, "host registration"));
  unsigned flags = cudaHostRegisterPortable;
  if (registration_.mode == RegistrationMode::kReadOnly) flags |= cudaHostRegisterReadOnly;
  absl::Status st = ctx_->Use();
  size_t registered = 0;
  for (; st.ok() && registered < plan.size(); ++registered) {
    const HostRange& c = plan[registered];
    const cudaError_t e = cudaHostRegister(HostPointer(c.address), c.bytes, flags);
    if (e != cudaSuccess) {
      // Any error but a sticky one means "use pinned staging for this range" to the caller.
      const bool fallback =
          ClassifyRegistrationFailure(static_cast<int>(e)) == RegistrationFailure::kFallBack;
      st = Annotate(
          ctx_->latch.Observe(EXPERTD_CUDA_ERROR(e, "cudaHostRegister(chunk, bytes, flags)")),
          absl::StrCat(fallback ? "direct path unavailable for this range (use staging): " : "",
                       "registering chunk ", registered, " of ", plan.size(), " (", c.bytes,
                       " bytes at 0x", absl::Hex(c.address), ", ",
                       AV(RegistrationModeName(registration_.mode)), ")"));
      break;
    }
  }
  if (!st.ok()) {
    for (size_t i = 0; i < registered; ++i) {
      (void)cudaHostUnregister(HostPointer(plan[i].address));
    }
    ctx_->pinned.Release(pinned);
    return st;
  }
  return std::make_unique<CudaRegisteredStaging>(ctx_.get(), memory, std::move(plan), pinned);
}

absl::Status CudaDevice::SubmitCopy(CopyRequest request, CopyCallback on_complete) {
  RETURN_IF_ERROR(ValidateCopyRequest(request));
  for (const CopySegment& s : request.segments) {
    const auto* arena = dynamic_cast<const CudaArena*>(s.arena);
    if (arena == nullptr || arena->owner() != ctx_.get()) return Foreign("arena");
  }
  for (const FenceWait& w : request.waits) {
    const auto* fences = dynamic_cast<const CudaFenceTable*>(w.fences);
    if (fences == nullptr || fences->owner() != ctx_.get()) return Foreign("fence table");
  }
  for (const FenceSignal& s : request.signals) {
    const auto* fences = dynamic_cast<const CudaFenceTable*>(s.fences);
    if (fences == nullptr || fences->owner() != ctx_.get()) return Foreign("fence table");
  }
  return engine_->Submit(std::move(request), std::move(on_complete));
}

absl::Status CudaDevice::ReadArena(const Arena& arena, uint64_t offset, std::span<uint8_t> out) {
  const auto* a = dynamic_cast<const CudaArena*>(&arena);
  if (a == nullptr || a->owner() != ctx_.get()) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("arena '", arena.label(), "' is not one of ", name_, "'s"));
  }
  if (!RangeInside(offset, out.size(), arena.reserved_bytes())) {
    return InvalidError(
        ErrorKind::kOutOfBounds,
        absl::StrCat("read of ", out.size(), " bytes at ", offset, " outside arena '",
                     arena.label(), "' of ", arena.reserved_bytes(), " bytes"));
  }
  if (out.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(ctx_->Use());
  EXPERTD_CUDA_RETURN_IF_ERROR(ctx_->latch, cudaMemcpy(out.data(), a->device_data() + offset,
                                                       out.size(), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(const CudaDeviceOptions& options) {
  return CudaDevice::Create(options);
}

absl::Status DeclareDone(FenceTable& fences, SlotId slot, uint64_t generation, bool recorded) {
  auto* table = dynamic_cast<CudaFenceTable*>(&fences);
  if (table == nullptr) return absl::OkStatus();
  return table->DeclareDone(slot, generation, recorded);
}

}  // namespace expertd::cuda
