// The daemon's side of one session's request lane (src/lane/lane.h): the shared segment, the
// session's lane thread that reads requests, and the Outbox that writes answers. The thread spins
// for `spin` after its last request (a client in a decode loop sends the next one within
// microseconds), then sleeps on the lane's doorbell (waking every 2 s to look at its stop
// flag, since the doorbell is the client's to scribble on): an idle session costs next to no
// CPU. Each session has its own thread, so the scheduler shares the CPU fairly between sessions
// however hard one floods its lane.
//
// Once stopped, the thread still reads what is left in the request ring for Hits records
// (client-side hits), so that they count; it handles nothing else then.
//
// Everything in the segment is the client's to scribble on. A broken record or an impossible
// index fails this session only: `fail` is called once with the reason, the lane is marked
// failed for the client, and nothing more is read. Answers that find the response ring full wait
// in a bounded queue (max_deferred); a client that lets more pile up fails the same way.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/host/host_device.h"
#include "expertd/v1/service.pb.h"
#include "lane/lane.h"
#include "sessions.h"

namespace expertd {

struct LaneOptions {
  bool enabled = true;  // offer lanes to sessions over the Unix socket
  lane::LaneGeometry geometry;  // pin_words is set per session
  bool client_hits = true;      // offer client-side hits where the engine publishes residency
  absl::Duration spin = absl::Microseconds(50);
  uint32_t max_deferred = 4096;
  HostDeviceOptions shm;  // backing, name prefix and mode of the segments (as the arenas')
};

class LaneServer final : public Outbox,
                         public std::enable_shared_from_this<LaneServer> {
 public:
  static absl::StatusOr<std::shared_ptr<LaneServer>> Create(const LaneOptions& options,
                                                            std::string_view label);
  ~LaneServer() override;

  v1::LaneHandle handle() const;
  // The client mapped the segment (it attached): its name is no longer needed.
  void Unlink();

  // Starts the lane thread: each request goes to `handle`, in order. `fail` is called at most
  // once, from whichever thread saw the client break the protocol.
  void Start(std::function<void(const lane::Request&)> handle,
             std::function<void(const absl::Status&)> fail);
  // Stops reading and answering (the session ended). Join waits for the thread unless called on
  // it.
  void Stop();
  void Join();

  // Outbox: encodes Grant, RequestError and LeaseExpired into the response ring.
  bool Push(v1::SessionResponse message) override;

  v1::LaneStats Stats() const;
  // The session's pin words in the segment (client-side hits); empty without them.
  std::span<uint64_t> pins() const { return end_.pins(); }
  bool failed() const { return failed_.load(); }

 private:
  LaneServer(const LaneOptions& options, std::unique_ptr<SharedSegment> segment,
             lane::LaneDaemonEnd end);
  void Loop();
  void Fail(const absl::Status& status);
  // Writes deferred answers while there is room. Call with write_mu_ held.
  absl::Status FlushLocked();

  const LaneOptions options_;
  std::unique_ptr<SharedSegment> segment_;
  lane::LaneDaemonEnd end_;
  std::function<void(const lane::Request&)> handle_;
  std::function<void(const absl::Status&)> fail_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::thread thread_;

  mutable std::mutex write_mu_;
  std::deque<std::vector<uint8_t>> deferred_;
  uint64_t deferred_total_ = 0;
  std::vector<uint8_t> record_;
};

}  // namespace expertd
