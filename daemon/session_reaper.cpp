// The session registry's reaper (SessionRegistry::ReapOnce, ReaperLoop; sessions.h says what
// it does): ends idle and unattached sessions, forces the leases of ended ones when their
// process exits or lease_ttl passes, and watches the clients whose done records the device may
// still wait on. Split from sessions.cpp, which holds the rest of the registry.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "sessions.h"
#include "spdlog/spdlog.h"
#include "util/status.h"

namespace expertd {
void SessionRegistry::ReapOnce(absl::Time now) {
  struct Expired {
    std::shared_ptr<Session> session;
    uint64_t lease;
    Grant grant;
  };
  std::vector<Expired> expired;  // reclaimed from live sessions: the client is told
  std::vector<std::pair<std::shared_ptr<Session>, Grant>> released;
  std::vector<std::shared_ptr<Session>> gone;  // their client process exited (once each)
  // Attached sessions whose process exited, and how to end their streams.
  std::vector<std::pair<std::shared_ptr<Session>, std::function<void(const absl::Status&)>>>
      orphaned;
  // Attached sessions whose done records the device gave up on.
  struct FencesFailed {
    std::shared_ptr<Session> session;
    std::function<void(const absl::Status&)> end_stream;
    absl::Status why;
  };
  std::vector<FencesFailed> fences_failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      // Held past the erase below, so that the session outlives the lock taken on it.
      const std::shared_ptr<Session> keep = it->second;
      Session& s = *keep;
      std::lock_guard<std::mutex> slock(s.mu_);
      if (!s.attached_ && now - s.opened_at_ > limits_.attach_timeout) {
        it = sessions_.erase(it);
        continue;
      }
      // A client process that died while its stream stays open (a child inherited the socket,
      // or the connection is not torn down yet): none of its done records needs waiting for
      // any more, and the session ends: nothing of it may outlive the process that opened it.
      if (s.attached_ && !s.client_gone_ && s.client_process_.Exited()) {
        s.client_gone_ = true;
        gone.push_back(it->second);
        if (s.end_stream_) orphaned.emplace_back(it->second, s.end_stream_);
      }
      if (s.attached_ && !s.fences_failed_ && !s.client_gone_) {
        if (absl::Status why = s.FencesFailure(); !why.ok()) {
          s.fences_failed_ = true;
          fences_failed.push_back({it->second, s.end_stream_, std::move(why)});
        }
      }
      const bool idle = now - s.last_request_ > limits_.lease_ttl;
      for (auto lit = s.leases_.begin(); lit != s.leases_.end();) {
        if (idle && now - lit->second.granted_at > limits_.lease_ttl) {
          s.slots_ -= lit->second.grant.slots.size();
          expired.push_back({it->second, lit->first, std::move(lit->second.grant)});
          lit = s.leases_.erase(lit);
        } else {
          ++lit;
        }
      }
      ++it;
    }
    for (auto it = ended_.begin(); it != ended_.end();) {
      const std::shared_ptr<Session> keep = it->session;  // outlives the lock, as above
      Session& s = *keep;
      const bool force = now >= it->deadline || s.client_process_.Exited();
      std::lock_guard<std::mutex> slock(s.mu_);
      for (auto lit = s.leases_.begin(); lit != s.leases_.end();) {
        if (force || s.DonePassed(lit->second.grant)) {
          s.slots_ -= lit->second.grant.slots.size();
          released.emplace_back(it->session, std::move(lit->second.grant));
          lit = s.leases_.erase(lit);
        } else {
          ++lit;
        }
      }
      if (!s.leases_.empty()) {
        ++it;
        continue;
      }
      // A dead client's done records are not waited for, even while an acquire of its is still
      // in flight: that acquire's copy may be the one waiting for them.
      if (s.WaitsForClient() && !s.client_gone_ && s.client_process_.Exited()) {
        s.client_gone_ = true;
        gone.push_back(it->session);
      }
      if (s.pending_ > 0) {  // kept (and counted) until its acquires in flight come back
        ++it;
        continue;
      }
      if (s.WaitsForClient() && !s.client_gone_) watched_.push_back(*it);
      it = ended_.erase(it);
    }
    for (auto it = watched_.begin(); it != watched_.end();) {
      if (it->session->client_process_.Exited()) {
        it->session->client_gone_ = true;
        gone.push_back(it->session);
      } else if (now < it->deadline) {
        ++it;
        continue;
      }
      it = watched_.erase(it);
    }
  }
  for (Expired& e : expired) {
    spdlog::warn("session {} ({}, pid {}): lease {} of layer {} reclaimed: held longer than "
                 "limits.lease_ttl while the session sent nothing",
                 e.session->id(), e.session->client_name().empty() ? "-" : e.session->client_name(),
                 e.session->peer().pid, e.lease, e.grant.layer);
    e.session->Reclaim(e.grant);
    v1::SessionResponse r;
    r.mutable_lease_expired()->set_lease(e.lease);
    e.session->Push(std::move(r));
  }
  // Draining leases: ForceDone is a no-op where the client did signal done.
  for (auto& [session, grant] : released) session->Reclaim(grant);
  for (const std::shared_ptr<Session>& session : gone) session->ClientGone();
  for (auto& [session, end_stream] : orphaned) {
    spdlog::warn("session {} ({}, pid {}): its process exited while the stream stayed open; "
                 "ending the session",
                 session->id().substr(0, 8),
                 session->client_name().empty() ? "-" : session->client_name(),
                 session->peer().pid);
    end_stream(absl::UnavailableError(absl::StrCat(
        "the process that opened this session (pid ", session->peer().pid, ") exited")));
  }
  for (FencesFailed& f : fences_failed) {
    ++done_record_failures_;
    spdlog::warn("session {} ({}, pid {}): ending it: {}", f.session->id().substr(0, 8),
                 f.session->client_name().empty() ? "-" : f.session->client_name(),
                 f.session->peer().pid, std::string(f.why.message()));
    if (f.end_stream) {
      f.end_stream(absl::AbortedError(absl::StrCat("the daemon ended this session: ",
                                                   f.why.message())));
    }
  }
  if (!expired.empty() || !released.empty()) Notify();
}

void SessionRegistry::ReaperLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, absl::ToChronoMilliseconds(limits_.reap_interval));
    if (stop_) break;
    lock.unlock();
    ReapOnce(absl::Now());
    lock.lock();
  }
}

}  // namespace expertd
