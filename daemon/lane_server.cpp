#include "lane_server.h"

#include <sched.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace expertd {

absl::StatusOr<std::shared_ptr<LaneServer>> LaneServer::Create(const LaneOptions& options,
                                                               std::string_view label) {
  if (absl::Status st = lane::CheckGeometry(options.geometry); !st.ok()) return st;
  absl::StatusOr<std::unique_ptr<SharedSegment>> segment =
      CreateSharedSegment(options.shm, label, options.geometry.segment_bytes());
  if (!segment.ok()) return segment.status();
  absl::StatusOr<lane::LaneDaemonEnd> end =
      lane::LaneDaemonEnd::Format((*segment)->data(), options.geometry);
  if (!end.ok()) return end.status();
  return std::shared_ptr<LaneServer>(
      new LaneServer(options, *std::move(segment), *std::move(end)));
}

LaneServer::LaneServer(const LaneOptions& options, std::unique_ptr<SharedSegment> segment,
                       lane::LaneDaemonEnd end)
    : options_(options), segment_(std::move(segment)), end_(std::move(end)) {}

LaneServer::~LaneServer() {
  stop_ = true;
  if (thread_.joinable()) {
    // The thread holds a reference while it runs: the last one may go on the thread itself.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      end_.Ring();
      thread_.join();
    }
  }
}

v1::LaneHandle LaneServer::handle() const {
  const SharedHandle h = segment_->handle();
  v1::LaneHandle out;
  v1::SharedMemory* m = out.mutable_memory();
  m->set_shm_name(h.shm_name);
  m->set_fd(h.fd);
  m->set_owner_pid(h.owner_pid);
  m->set_dev(h.dev);
  m->set_inode(h.inode);
  out.set_segment_bytes(options_.geometry.segment_bytes());
  out.set_request_bytes(options_.geometry.request_bytes);
  out.set_response_bytes(options_.geometry.response_bytes);
  out.set_pin_words(options_.geometry.pin_words);
  return out;
}

void LaneServer::Unlink() { segment_->Unlink(); }

void LaneServer::Start(std::function<void(const lane::Request&)> handle,
                       std::function<void(const absl::Status&)> fail) {
  handle_ = std::move(handle);
  fail_ = std::move(fail);
  thread_ = std::thread([self = shared_from_this()] { self->Loop(); });
}

void LaneServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    stop_ = true;
    deferred_.clear();
  }
  if (!failed_.load()) end_.SetState(lane::kStateClosed);
  end_.Ring();
}

void LaneServer::Join() {
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void LaneServer::Fail(const absl::Status& status) {
  if (failed_.exchange(true)) return;
  stop_ = true;
  end_.SetState(lane::kStateFailed);
  if (fail_) fail_(status);
}

void LaneServer::Loop() {
  lane::Request request;
  absl::Time last = absl::Now();
  absl::Duration deferred_wait = absl::Milliseconds(1);
  while (!stop_.load()) {
    bool got = false;
    if (absl::Status st = end_.Next(&request, &got); !st.ok()) return Fail(st);
    if (got) {
      handle_(request);
      last = absl::Now();
      continue;
    }
    bool waiting = false;
    absl::Status flushed;
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      flushed = FlushLocked();
      waiting = !deferred_.empty();
    }
    if (!flushed.ok()) return Fail(flushed);
    if (absl::Now() - last < options_.spin) {
      // Yield while watching: on a busy host the client (or another session's thread) may need
      // this very core to write the next request.
      sched_yield();
      continue;
    }
    // Deferred answers wait for the client to read: look again after 1 ms, backing off to
    // 100 ms while it does not. Otherwise sleep until rung, but never without a limit: the
    // doorbell is the client's to write, and a stop's wake could be lost to it.
    if (waiting) {
      end_.Sleep(deferred_wait, stop_);
      deferred_wait = std::min(deferred_wait * 2, absl::Milliseconds(100));
    } else {
      deferred_wait = absl::Milliseconds(1);
      end_.Sleep(absl::Seconds(2), stop_);
    }
  }
  // Stopped (the session ends): client-side hits the client reported and the thread had not
  // read yet still count, so the model's counters add up once a session is gone. Nothing else
  // is handled any more (the session's end gives back its leases).
  for (int i = 0; i < 4096 && !failed_.load(); ++i) {
    bool got = false;
    if (!end_.Next(&request, &got).ok() || !got) break;
    if (request.type == lane::RecordType::kHits) handle_(request);
  }
}

absl::Status LaneServer::FlushLocked() {
  bool wrote = false;
  while (!deferred_.empty()) {
    absl::StatusOr<bool> ok = end_.Write(deferred_.front());
    if (!ok.ok()) return ok.status();
    if (!*ok) break;
    deferred_.pop_front();
    wrote = true;
  }
  if (wrote) end_.WakeClient();
  return absl::OkStatus();
}

bool LaneServer::Push(v1::SessionResponse message) {
  std::unique_lock<std::mutex> lock(write_mu_);
  if (stop_.load()) return false;
  record_.clear();
  absl::Status encoded;
  if (message.has_grant()) {
    const v1::Grant& g = message.grant();
    lane::Response r;
    r.type = lane::RecordType::kGrant;
    r.seq = g.seq();
    r.lease = g.lease();
    r.layer = g.layer();
    r.stall_ns = g.stall_us() * 1000;
    for (const v1::GrantedSlot& s : g.slots()) {
      r.slots.push_back({s.expert(), s.slot_class(), s.slot(), s.hit(), s.generation()});
    }
    encoded = lane::EncodeGrant(r, &record_);
  } else if (message.has_error()) {
    encoded = lane::EncodeError(message.error().seq(), message.error().code(),
                                message.error().message(), &record_);
  } else if (message.has_lease_expired()) {
    encoded = lane::EncodeLeaseExpired(message.lease_expired().lease(), &record_);
  } else {
    return false;  // Attached goes on the stream
  }
  absl::Status failure = encoded;
  if (failure.ok()) {
    absl::StatusOr<bool> written = deferred_.empty() ? end_.Write(record_) : false;
    if (!written.ok()) {
      failure = written.status();
    } else if (*written) {
      end_.WakeClient();
      return true;
    } else if (deferred_.size() >= options_.max_deferred) {
      failure = absl::ResourceExhaustedError(absl::StrCat(
          "lane: ", deferred_.size(), " answers wait for room in the response ring; the client "
          "does not read its lane"));
    } else {
      deferred_.push_back(record_);
      ++deferred_total_;
      lock.unlock();
      end_.Ring();  // the lane thread retries while answers are deferred
      return true;
    }
  }
  lock.unlock();
  Fail(failure);
  return false;
}

v1::LaneStats LaneServer::Stats() const {
  const lane::DaemonCounters c = end_.counters();
  v1::LaneStats s;
  s.set_requests(c.requests);
  s.set_responses(c.responses);
  s.set_bytes_in(c.bytes_in);
  s.set_bytes_out(c.bytes_out);
  s.set_daemon_sleeps(c.sleeps);
  s.set_client_wakes(c.client_wakes);
  std::lock_guard<std::mutex> lock(write_mu_);
  s.set_deferred(deferred_total_);
  return s;
}

}  // namespace expertd
