// Sessions and leases, without gRPC. A session belongs to one model and one client; each
// granted acquire is a lease the client gives back with Release after signalling done for its
// slots. The registry enforces the limits and reclaims what clients leave behind:
//  - a session that is opened but never attached within attach_timeout is dropped;
//  - a lease held longer than lease_ttl by a session that has sent nothing for as long (a client
//    hanging while connected) is reclaimed: the daemon signals done on the client's behalf,
//    releases it and tells the session (LeaseExpired);
//  - when a session ends (its stream closed for any reason), each lease is released once its
//    done fences pass, or at once when the client process has exited (ProcessWatch), or after
//    lease_ttl at the latest; beyond max_sessions ended sessions, the oldest at once;
//  - one session holds at most SlotsPerSession slots, so that others keep a share of the pool.
// Nothing here blocks on I/O: grants arrive on engine threads and go out through the session's
// Outbox: the stream's write queue, or the session's request lane (lane_server.h), which then
// also carries the requests. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "expertd/v1/service.pb.h"
#include "lane/lane.h"
#include "served_model.h"
#include "util/latency_histogram.h"
#include "util/process.h"

namespace expertd {

struct SessionLimits {
  uint32_t max_sessions = 64;
  uint32_t max_leases_per_session = 1024;
  uint32_t max_experts_per_acquire = 64;
  uint32_t max_slots_per_session = 0;  // 0: SlotsPerSession's default
  absl::Duration lease_ttl = absl::Seconds(60);
  absl::Duration attach_timeout = absl::Seconds(10);
  uint64_t max_message_bytes = uint64_t{4} << 20;
  absl::Duration reap_interval = absl::Milliseconds(50);
};

// The slots one session of `model` may hold at once (leases plus acquires in flight):
// limits.max_slots_per_session, or by default half of the model's slots but at least one
// acquire of max_experts_per_acquire; never more than the model has.
uint32_t SlotsPerSession(const SessionLimits& limits, const ServedModel& model);

// Who is on the other end of a connection (SO_PEERCRED on the Unix socket; unknown on TCP).
struct Peer {
  bool unix_socket = false;
  uint32_t uid = 0;
  uint32_t gid = 0;
  int64_t pid = 0;
};

// Where a session's replies go: the stream's write queue. Push returns false once the stream
// is closed (the message is dropped).
class Outbox {
 public:
  virtual ~Outbox() = default;
  virtual bool Push(v1::SessionResponse message) = 0;
};

struct SessionCounters {
  uint64_t acquires = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t errors = 0;
  uint32_t leases_held = 0;
  LatencyHistogram stall;
};

class SessionRegistry;
class LaneServer;
struct LaneOptions;

class Session : public std::enable_shared_from_this<Session> {
 public:
  const std::string& id() const { return id_; }
  ServedModel& model() const { return *model_; }
  const Peer& peer() const { return peer_; }
  const std::string& client_name() const { return client_name_; }

  // Handles one request of the stream. Answers (Grant, RequestError, LeaseExpired) go to the
  // outbox given at Attach, possibly before this returns.
  void Acquire(const v1::Acquire& request);
  void Prefetch(const v1::Prefetch& request);
  void Release(const v1::Release& request);
  // One request read from the session's lane (batches become one call per layer or lease).
  void HandleLane(const lane::Request& request);

  SessionCounters counters() const;
  v1::SessionStats Stats() const;
  // The slot-class handles this session's client maps: the model's, with the session's own
  // done fences.
  std::vector<v1::SlotClassHandles> Handles() const;
  // The session's lane, or nullptr when its requests travel on the stream.
  const std::shared_ptr<LaneServer>& lane() const { return lane_; }
  // The descriptors of the objects its OpenSession answer marks `passed` (in order); they stay
  // open while the session lives (they belong to its objects and its model's).
  void SetPassed(std::vector<int> fds);

  ~Session();

 private:
  friend class SessionRegistry;
  struct Lease {
    Grant grant;
    absl::Time granted_at;
  };
  Session(SessionRegistry* registry, std::string id, ServedModel* model, Peer peer,
          std::string client_name);
  void Fail(uint64_t seq, const absl::Status& status);
  void Push(v1::SessionResponse message);
  void Touch();
  // Signals done for every slot of `grant` on the client's behalf and releases it.
  void Reclaim(const Grant& grant);
  // True when the client's own done words passed every slot of `grant` (host device), or when
  // the device gave up on the session's done records (FencesFailure: nothing is waited for);
  // false where the daemon cannot see done on the CPU (CUDA events) until the client releases.
  bool DonePassed(const Grant& grant) const;
  // OK, or why the device gave up on this session's done records (SessionFences::Failure).
  absl::Status FencesFailure() const;
  // True when copies may wait on this session's done records after its leases are gone
  // (SessionFences::WaitsForClient): its ended session is watched until the process exits.
  bool WaitsForClient() const;
  // The client process exited: none of its done records is waited for.
  void ClientGone();
  // Client-side hits: this session's pin row in the engine (registered at Open).
  uint64_t PinOwner() const { return reinterpret_cast<uintptr_t>(this); }
  void DropPins();

  SessionRegistry* const registry_;
  const std::string id_;
  ServedModel* const model_;
  const Peer peer_;
  const std::string client_name_;
  const absl::Time opened_at_;
  ProcessWatch client_process_;  // to see the client exit; invalid when it cannot be watched
  const uint32_t slot_bound_;  // SlotsPerSession, fixed at open (off the acquire path)
  // One per slot class with session fences (CUDA), else empty; fixed after Open.
  std::vector<std::unique_ptr<SessionFences>> fences_;
  std::vector<v1::FenceTableHandle> fence_handles_;
  std::shared_ptr<LaneServer> lane_;  // fixed after Open
  std::vector<int> passed_;           // guarded by mu_
  // Ends the session's stream (from Attach); the reaper calls it when the process that opened
  // the session exited while the stream stayed open. Guarded by mu_.
  std::function<void(const absl::Status&)> end_stream_;
  bool client_gone_ = false;  // ClientGone was queued (guarded by the registry's mu_)
  bool fences_failed_ = false;  // the reaper ended it for FencesFailure (guarded by mu_)

  mutable std::mutex mu_;
  std::shared_ptr<Outbox> outbox_;  // set by Attach, cleared by End
  bool attached_ = false;
  bool ended_ = false;
  absl::Time last_request_;  // the last Acquire, Prefetch or Release
  uint32_t pending_ = 0;  // acquires sent to the engine and not answered yet
  uint64_t slots_ = 0;    // slots of leases_ plus those asked for by pending acquires
  uint64_t next_lease_ = 1;
  std::map<uint64_t, Lease> leases_;
  SessionCounters counters_;
  std::atomic<uint64_t> client_hits_{0};  // experts of the client's kHits records
};

class SessionRegistry {
 public:
  explicit SessionRegistry(SessionLimits limits);
  // With lanes: sessions over the Unix socket get one unless they ask for the stream.
  SessionRegistry(SessionLimits limits, const LaneOptions& lanes);
  ~SessionRegistry();  // reclaims everything still held

  const SessionLimits& limits() const { return limits_; }

  // A new session on `model`. ResourceExhausted at max_sessions; FailedPrecondition while
  // draining.
  // The transport: TRANSPORT_AUTO gives Unix peers a lane when lanes are on;
  // TRANSPORT_LANE is FailedPrecondition where no lane can be had.
  absl::StatusOr<std::shared_ptr<Session>> Open(ServedModel* model, const Peer& peer,
                                                std::string client_name,
                                                v1::Transport transport = v1::TRANSPORT_AUTO);
  // Binds the session's stream. NotFound for an unknown (or expired) id; FailedPrecondition when
  // the session already has a stream or `peer` is not on the Unix socket, PermissionDenied when
  // `peer` is not the opener's uid.
  // A lane session's answers go to its lane from now on; `end_stream` is how the lane ends the
  // stream when the client breaks the lane protocol (the session then ends as usual).
  absl::StatusOr<std::shared_ptr<Session>> Attach(
      const std::string& id, const Peer& peer, std::shared_ptr<Outbox> outbox,
      std::function<void(const absl::Status&)> end_stream = nullptr);
  // The session's stream ended: the session is gone; its leases drain (see the file comment).
  void End(const std::shared_ptr<Session>& session);
  // What the handle socket sends a session's client: the session (held while its descriptors
  // are sent) and the descriptors its OpenSession answer marked `passed`, in that order
  // (Session::SetPassed). NotFound for an unknown id; PermissionDenied unless `peer` is the
  // process that opened it; FailedPrecondition once it is attached (clients fetch first).
  absl::StatusOr<std::pair<std::shared_ptr<Session>, std::vector<int>>> Passed(
      const std::string& id, const Peer& peer);

  // Shutdown: new acquires and sessions are refused from now on.
  void BeginDrain();
  bool draining() const;
  // Ended sessions still draining leases (at most max_sessions are waited for; older ones are
  // reclaimed early) or watched for their process to exit.
  size_t ended_sessions() const;
  // Leases held by live sessions plus leases still draining.
  uint64_t LeasesOutstanding() const;
  // Waits until no lease is outstanding or `timeout` passed; true when none is left.
  bool WaitDrained(absl::Duration timeout);

  std::vector<std::shared_ptr<Session>> Sessions() const;
  size_t size() const;
  // Sessions failed for breaking the lane protocol, since start.
  uint64_t lane_failures() const { return lane_failures_.load(); }
  // Sessions ended because the device gave up on their done records (a client context that
  // failed, or a record pending past lease_ttl), since start.
  uint64_t done_record_failures() const { return done_record_failures_.load(); }

  // One pass of the reaper (the registry's thread runs it every reap_interval; tests call it).
  void ReapOnce(absl::Time now);

 private:
  friend class Session;
  struct Draining {
    std::shared_ptr<Session> session;
    absl::Time deadline;
  };
  // Ended sessions with session fences whose leases are all back: kept until their process
  // exits (then ClientGone) or lease_ttl passed, so a dead client's last records are never
  // waited for.
  std::vector<Draining> watched_;
  void ReaperLoop();
  void Notify();
  // OK while a session may be opened: not draining and below max_sessions.
  absl::Status Room() const;
  absl::Status RoomLocked() const;
  absl::StatusOr<std::shared_ptr<Session>> AttachLocked(const std::string& id, const Peer& peer,
                                                        std::shared_ptr<Outbox> outbox);

  const SessionLimits limits_;
  std::unique_ptr<LaneOptions> lanes_;  // nullptr: every session uses its stream
  std::atomic<uint64_t> lane_failures_{0};
  std::atomic<uint64_t> done_record_failures_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool draining_ = false;
  std::map<std::string, std::shared_ptr<Session>> sessions_;
  std::vector<Draining> ended_;
  std::thread reaper_;
};

// A 128-bit random token in hex.
std::string NewSessionId();
// A client's name as stats show it: valid UTF-8 (invalid bytes become '?'), at most 64 bytes,
// cut at a character boundary.
std::string ClientNameForStats(std::string name);

}  // namespace expertd
