// The C++ client of expertd, for inference engines and tools. A Client is one channel to the
// daemon; a Session leases expert slots of one model and reads them in place: the arenas of each
// slot class are mapped once per process (shared by every session of that process) and a
// granted expert's projections are pointers into them. expertd_client.h is the C API over this.
//
//   auto client = Client::Connect({.address = "unix:///run/expertd/expertd.sock"});
//   auto session = (*client)->OpenSession({.model = "mixtral"});
//   auto lease = (*session)->Acquire(layer, experts);      // blocks until every slot is ready
//   ... run kernels on lease->slots[i].projections[p] ...
//   (*session)->Release(*lease);                           // signals done, gives slots back
//
// CUDA sessions (info().device_kind() == "cuda"): the arenas are opened with CUDA IPC in this
// process and slots are device pointers (SlotView::device_projections). Acquire returns when
// the grant arrived; the copy may still be running on the daemon's stream, so:
//   (*session)->WaitReady(*lease, stream);   // the stream waits for the copies, on the GPU
//   ... launch kernels on `stream` reading the slots ...
//   (*session)->RecordDone(*lease, stream);  // records this session's done events after them
//   (*session)->Release(*lease);             // the daemon's next copy into a slot waits on them
// Nothing blocks the CPU; the same calls on a host session are a no-op and a done signal.
//
// Requests travel through the session's shared-memory request lane when the daemon offers one
// (SessionOptions::transport; docs/protocol.md, "The request lane"): a caller watches for its
// answer for 50 µs, then sleeps on the lane's futex. Over the stream otherwise. An acquire of
// resident experts needs no request at all (client-side hits, SessionOptions::client_hits): it
// pins them through the daemon's residency table, and its Release unpins them (CUDA: once the
// work RecordDone followed has finished); such a lease never expires (its id has the top bit set).
//
// Threading: Client and Session are thread-safe; several threads may acquire on one session.
// Errors are absl::Status with the daemon's gRPC code (docs/protocol.md lists them).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "expertd/v1/service.pb.h"

namespace expertd::client {

struct ConnectOptions {
  // "unix:///run/expertd/expertd.sock", "unix:/path", or "HOST:PORT" (TCP: no sessions).
  std::string address;
  std::string token;  // TCP bearer token; empty for the Unix socket
  absl::Duration connect_timeout = absl::Seconds(5);
};

struct SessionOptions {
  std::string model;
  std::string device;       // "" = the model's default device; else "host", "cuda:0", ...
  std::string client_name;  // shown in stats
  // CUDA sessions: this process's ordinal of the daemon's GPU. -1 (the default): found by the
  // GPU's UUID, which the daemon sends (the processes may see different CUDA_VISIBLE_DEVICES);
  // a value >= 0 must name that same GPU, or OpenSession fails saying which one it is here.
  int cuda_device = -1;
  // Where Acquire, Prefetch and Release travel. kAuto: the session's shared-memory request lane
  // when the daemon offers one (sessions over the Unix socket), else the stream. kStream: the
  // stream always. kLane: the lane, or OpenSession fails.
  enum class Transport { kAuto, kStream, kLane };
  Transport transport = Transport::kAuto;
  // Client-side hits (docs/protocol.md): where the daemon offers them (sessions over the lane),
  // an Acquire whose experts are all resident pins them in this process and returns without a
  // request; only acquires that miss go to the daemon. false: every acquire asks.
  bool client_hits = true;
  // Acquire retries while the daemon answers UNAVAILABLE (every slot leased right now), with
  // backoff, up to the acquire's timeout.
};

// One granted expert: where each projection's bytes are in this process.
struct SlotView {
  uint32_t expert = 0;
  uint32_t slot_class = 0;
  uint32_t slot = 0;
  uint64_t generation = 0;
  bool hit = false;
  std::vector<std::span<const uint8_t>> projections;  // host sessions: in projection order
  std::vector<const void*> device_projections;        // CUDA sessions: device pointers
};

// Prefetch hints for one layer (most likely expert first).
struct PrefetchHint {
  uint32_t layer = 0;
  std::vector<uint32_t> experts;
};

struct Lease {
  uint64_t id = 0;
  uint32_t layer = 0;
  std::vector<SlotView> slots;  // in the order of the requested experts
  absl::Duration stall;         // daemon-side request-to-grant time
};

// One mapped arena of a session: its bytes in this process, and an owner that keeps the mapping
// alive (for leases or tensors that outlive the Session object).
struct ArenaRef {
  std::shared_ptr<const void> keep_alive;
  std::span<const uint8_t> bytes;  // host: slot s of the projection at bytes[s * stride, +stride)
  const void* device_ptr = nullptr;  // CUDA: the arena in this process (bytes is empty)
  uint64_t device_bytes = 0;         // CUDA: the arena's usable bytes
  uint64_t stride = 0;
  uint32_t slots = 0;
};

class Session {
 public:
  virtual ~Session() = default;  // ends the stream: the daemon releases what is still leased
  virtual const v1::ModelInfo& model() const = 0;
  // The arena of (slot class, projection); the same mapping every SlotView points into.
  // InvalidArgument for a class or projection that does not exist.
  virtual absl::StatusOr<ArenaRef> arena(uint32_t slot_class, uint32_t projection) const = 0;
  virtual const v1::OpenSessionResponse& info() const = 0;
  // CUDA sessions: this process's ordinal of the daemon's GPU (found by its UUID; see
  // SessionOptions::cuda_device): streams passed to WaitReady / RecordDone must be of it.
  // -1 for host sessions.
  virtual int cuda_device() const = 0;
  // Leases one slot per expert of `layer`; returns when every slot is ready to read. Retries
  // UNAVAILABLE until `timeout`; other errors as the daemon sent them (INVALID_ARGUMENT,
  // RESOURCE_EXHAUSTED, ...), DEADLINE_EXCEEDED after `timeout`, UNAVAILABLE when the stream
  // ended.
  virtual absl::StatusOr<Lease> Acquire(uint32_t layer, std::span<const uint32_t> experts,
                                        absl::Duration timeout = absl::Seconds(30)) = 0;
  // A prediction: stage these experts of `layer` (most likely first). No answer.
  virtual absl::Status Prefetch(uint32_t layer, std::span<const uint32_t> experts) = 0;
  // Several layers' hints at once: one lane record (one stream message per layer).
  virtual absl::Status Prefetch(std::span<const PrefetchHint> hints) = 0;
  // "lane" or "stream": where this session's requests travel.
  virtual std::string_view transport() const = 0;
  // True when acquires of resident experts are served in this process (client-side hits).
  virtual bool client_hits() const = 0;
  // CUDA: makes `cuda_stream` (a cudaStream_t; nullptr = the legacy default stream) wait on
  // the GPU until the copies behind every slot of the lease landed. Host: nothing to do (Acquire
  // returned with the slots ready). Call it before the kernels that read the slots.
  virtual absl::Status WaitReady(const Lease& lease, void* cuda_stream) = 0;
  // CUDA: the same wait on the CPU: returns when those copies landed (for engines whose kernels
  // run on streams they cannot pass here; they must order their kernels after this call). Counts
  // as WaitReady for RecordDone and Release. Host: nothing to do.
  virtual absl::Status WaitReadyOnHost(const Lease& lease) = 0;
  // CUDA: after the kernels that read the lease's slots were queued on `cuda_stream`, records
  // this session's done event of each slot there. FailedPrecondition when WaitReady was not
  // called for the lease. Host: signals done now (the reads must have returned).
  virtual absl::Status RecordDone(const Lease& lease, void* cuda_stream) = 0;
  // Copies projection `projection` of a granted slot into `out` (its expert_bytes), on any
  // device: host memcpy, or CUDA device-to-host on `cuda_stream` after the lease's WaitReady
  // (synchronous). For tools and verification (expertctl bench), not for engines.
  virtual absl::Status CopySlot(const SlotView& slot, size_t projection, std::span<uint8_t> out,
                                void* cuda_stream) = 0;
  // Signals done for every slot of the lease (host: this process finished reading; CUDA:
  // RecordDone must have been called after WaitReady, else FailedPrecondition and the lease is
  // kept — a lease never waited for is given back as unread), then gives the lease back. Errors
  // the daemon reports later are collected (TakeAsyncErrors).
  // CUDA, several streams: RecordDone chains on the slot's previous record, so a stream that
  // records done for a slot also waits for the other streams' kernels on that slot.
  virtual absl::Status Release(const Lease& lease) = 0;
  // Release without waking the daemon's lane thread for it: the release takes effect when the
  // daemon next reads the lane — with this session's next request (an engine's next layer's
  // Acquire), Flush, or the end of the lane thread's sleep (2 s at most). Saves a wake-up per
  // layer where acquires follow releases closely. Over the stream, the same as Release.
  virtual absl::Status ReleaseLater(const Lease& lease) = 0;
  // Wakes the daemon for what ReleaseLater wrote and it has not read.
  virtual void Flush() = 0;
  // Sends a raw request on the stream (protocol tests): Release with any lease id, etc. On a
  // lane session the answers still come on the lane.
  virtual absl::Status SendRaw(const v1::SessionRequest& request) = 0;
  // Errors answered for requests nobody waits on (releases), and leases the daemon reclaimed.
  virtual std::vector<v1::RequestError> TakeAsyncErrors() = 0;
  virtual std::vector<uint64_t> TakeExpiredLeases() = 0;
  // Ends the stream now (the destructor does it too). CUDA: first waits, up to 30 s, for the
  // work recorded after released client-side hits (the daemon drops their pins with the session).
  virtual void Close() = 0;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ConnectOptions& options);
  virtual ~Client() = default;
  virtual absl::StatusOr<std::vector<v1::ModelInfo>> ListModels() = 0;
  virtual absl::StatusOr<v1::GetStatsResponse> GetStats(const std::string& model = "") = 0;
  // Opens a session, maps its arenas and fence tables, and attaches its stream.
  virtual absl::StatusOr<std::unique_ptr<Session>> OpenSession(const SessionOptions& options) = 0;
  // grpc.health.v1 Check: SERVING is true; NOT_SERVING false; transport/RPC failures are errors.
  virtual absl::StatusOr<bool> Health(const std::string& service = "") = 0;
};

// "unix:///p" / "unix:/p" / "/p" → the gRPC target; "host:port" unchanged.
std::string ChannelTarget(const std::string& address);

}  // namespace expertd::client
