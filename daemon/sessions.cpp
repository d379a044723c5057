#include "sessions.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lane_server.h"
#include "spdlog/spdlog.h"
#include "util/status.h"

namespace expertd {
namespace {

absl::Status ForClient(const absl::Status& st) {
  // The engine says NotFound / OutOfRange for a bad layer or expert; to the client both are an
  // invalid argument of its request.
  if (st.code() == absl::StatusCode::kNotFound || st.code() == absl::StatusCode::kOutOfRange) {
    return absl::InvalidArgumentError(st.message());
  }
  return st;
}

}  // namespace

std::string ClientNameForStats(std::string name) {
  // proto3 strings must be UTF-8, and GetStats carries this one to every caller: one bad name
  // would break every stats response. Keep valid sequences, replace the rest with '?', cut at
  // a character boundary.
  std::string out;
  for (size_t i = 0; i < name.size();) {
    const auto c = static_cast<unsigned char>(name[i]);
    const size_t len = c < 0x80            ? 1
                       : (c >> 5) == 0x6   ? 2
                       : (c >> 4) == 0xe   ? 3
                       : (c >> 3) == 0x1e  ? 4
                                           : 0;
    bool ok = len > 0 && i + len <= name.size();
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(name[i + k]) & 0xc0) == 0x80;
    }
    const size_t take = ok ? len : 1;
    if (out.size() + take > 64) break;
    if (ok) {
      out.append(name, i, len);
    } else {
      out += '?';
    }
    i += take;
  }
  return out;
}

std::string NewSessionId() {
  uint8_t bytes[16] = {};
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  std::string hex;
  char two[3];
  for (uint8_t b : bytes) {
    std::snprintf(two, sizeof two, "%02x", b);
    hex += two;
  }
  return hex;
}

// ---- Session ---------------------------------------------------------------------------------

Session::Session(SessionRegistry* registry, std::string id, ServedModel* model, Peer peer,
                 std::string client_name)
    : registry_(registry),
      id_(std::move(id)),
      model_(model),
      peer_(peer),
      client_name_(std::move(client_name)),
      opened_at_(absl::Now()),
      client_process_(ProcessWatch::Open(peer.pid)),
      slot_bound_(SlotsPerSession(registry->limits(), *model)),
      last_request_(opened_at_) {}

uint32_t SlotsPerSession(const SessionLimits& limits, const ServedModel& model) {
  uint64_t total = 0;
  for (size_t c = 0; c < model.catalog().slot_classes().size(); ++c) {
    total += model.engine().slots(static_cast<uint32_t>(c));
  }
  uint64_t bound = limits.max_slots_per_session;
  if (bound == 0) bound = std::max<uint64_t>((total + 1) / 2, limits.max_experts_per_acquire);
  return static_cast<uint32_t>(std::min<uint64_t>(bound, std::max<uint64_t>(total, 1)));
}

void Session::Touch() {
  std::lock_guard<std::mutex> lock(mu_);
  last_request_ = absl::Now();
}

Session::~Session() { DropPins(); }

void Session::DropPins() {
  if (lane_ && !lane_->pins().empty()) model_->engine().RemovePins(PinOwner());
}

void Session::Push(v1::SessionResponse message) {
  std::shared_ptr<Outbox> outbox;
  {
    std::lock_guard<std::mutex> lock(mu_);
    outbox = outbox_;
  }
  if (outbox) outbox->Push(std::move(message));
}

void Session::Fail(uint64_t seq, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.errors;
  }
  v1::SessionResponse r;
  v1::RequestError* e = r.mutable_error();
  e->set_seq(seq);
  e->set_code(static_cast<int32_t>(status.code()));
  e->set_message(std::string(status.message()));
  Push(std::move(r));
}

void Session::Acquire(const v1::Acquire& request) {
  Touch();
  const uint64_t seq = request.seq();
  const SessionLimits& limits = registry_->limits();
  if (registry_->draining()) {
    return Fail(seq, absl::UnavailableError("the daemon is shutting down: no new acquires"));
  }
  if (request.experts().empty()) {
    return Fail(seq, absl::InvalidArgumentError(absl::StrCat("acquire ", seq, ": no experts")));
  }
  if (static_cast<uint32_t>(request.experts_size()) > limits.max_experts_per_acquire) {
    return Fail(seq, absl::InvalidArgumentError(absl::StrCat(
                         "acquire ", seq, ": ", request.experts_size(),
                         " experts; at most ", limits.max_experts_per_acquire, " per acquire")));
  }
  const MoeLayer* layer = model_->catalog().FindLayer(request.layer());
  if (layer == nullptr) {
    return Fail(seq, absl::InvalidArgumentError(absl::StrCat(
                         "acquire ", seq, ": layer ", request.layer(), " is not an MoE layer of ",
                         model_->name())));
  }
  for (uint32_t e : request.experts()) {
    if (e >= layer->n_expert) {
      return Fail(seq, absl::InvalidArgumentError(
                           absl::StrCat("acquire ", seq, ": expert ", e, " of layer ",
                                        request.layer(), " is out of range (the layer has ",
                                        layer->n_expert, " experts)")));
    }
  }
  const uint64_t n = static_cast<uint64_t>(request.experts_size());
  bool over = false;
  uint64_t held = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A request read after the session ended (its lane thread was still at it): nobody waits.
    if (ended_) return;
    over = leases_.size() + pending_ >= limits.max_leases_per_session;
    held = slots_;
    if (!over && slots_ + n <= slot_bound_) {
      ++pending_;
      slots_ += n;
      ++counters_.acquires;
    }
  }
  if (over) {
    return Fail(seq, absl::ResourceExhaustedError(absl::StrCat(
                         "acquire ", seq, ": the session holds ", limits.max_leases_per_session,
                         " leases (the per-session limit); release some first")));
  }
  if (held + n > slot_bound_) {
    return Fail(seq, absl::ResourceExhaustedError(absl::StrCat(
                         "acquire ", seq, ": the session holds ", held, " slots and asks for ",
                         n, " more; a session may hold ", slot_bound_,
                         " (limits.max_slots_per_session); release some first")));
  }
  std::vector<uint32_t> experts(request.experts().begin(), request.experts().end());
  model_->engine().AcquireAsync(
      request.layer(), experts,
      [self = shared_from_this(), seq, n](absl::StatusOr<Grant> grant) {
        if (!grant.ok()) {
          {
            std::lock_guard<std::mutex> lock(self->mu_);
            --self->pending_;
            self->slots_ -= n;
          }
          return self->Fail(seq, ForClient(grant.status()));
        }
        v1::SessionResponse r;
        {
          std::lock_guard<std::mutex> lock(self->mu_);
          // An ended session counts the acquire until its grant is given back (below), so the
          // registry sees the slots as outstanding until then.
          if (!self->ended_) {
            --self->pending_;
            const uint64_t lease = self->next_lease_++;
            v1::Grant* g = r.mutable_grant();
            g->set_seq(seq);
            g->set_lease(lease);
            g->set_layer(grant->layer);
            g->set_stall_us(static_cast<uint64_t>(absl::ToInt64Microseconds(grant->stall)));
            for (const GrantedSlot& s : grant->slots) {
              v1::GrantedSlot* out = g->add_slots();
              out->set_expert(s.expert);
              out->set_slot_class(s.slot_class);
              out->set_slot(s.slot);
              out->set_generation(s.generation);
              out->set_hit(s.hit);
              ++(s.hit ? self->counters_.hits : self->counters_.misses);
            }
            const auto ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(grant->stall));
            self->counters_.stall.Add(ns);
            self->model_->RecordStall(ns);
            self->leases_.emplace(lease, Lease{*std::move(grant), absl::Now()});
          }
        }
        if (r.has_grant()) return self->Push(std::move(r));
        // The stream ended while the read was in flight: nobody will ever see this grant.
        self->Reclaim(*grant);
        std::lock_guard<std::mutex> lock(self->mu_);
        --self->pending_;
        self->slots_ -= n;
      });
}

void Session::Prefetch(const v1::Prefetch& request) {
  Touch();
  if (registry_->draining()) return;
  const MoeLayer* layer = model_->catalog().FindLayer(request.layer());
  if (layer == nullptr) return;  // a hint: a bad one is ignored, never an error
  std::vector<uint32_t> experts;
  for (uint32_t e : request.experts()) {
    if (e < layer->n_expert && experts.size() < registry_->limits().max_experts_per_acquire) {
      experts.push_back(e);
    }
  }
  if (!experts.empty()) model_->engine().Prefetch(request.layer(), experts);
}

absl::Status Session::FencesFailure() const {
  for (const std::unique_ptr<SessionFences>& f : fences_) {
    if (absl::Status st = f->Failure(); !st.ok()) return st;
  }
  return absl::OkStatus();
}

bool Session::DonePassed(const Grant& grant) const {
  if (!FencesFailure().ok()) return true;  // nothing of it is waited for any more
  for (const GrantedSlot& s : grant.slots) {
    if (!fences_[s.slot_class]->Signalled(s.slot, s.generation)) return false;
  }
  return true;
}

void Session::Release(const v1::Release& request) {
  Touch();
  const uint64_t lease = request.lease();
  absl::Status refused;
  Grant grant;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = leases_.find(lease);
    if (it == leases_.end()) {
      refused = absl::NotFoundError(absl::StrCat(
          "release ", request.seq(), ": lease ", lease,
          " is not held by this session (never granted, released already, or expired)"));
    } else {
      // The client signalled done before releasing (host: in its own done words, which the
      // device checks; CUDA: recorded on its stream, which copies that overwrite these slots
      // wait for on the GPU).
      for (const GrantedSlot& s : it->second.grant.slots) {
        absl::Status st = fences_[s.slot_class]->DeclareDone(s.slot, s.generation);
        if (!st.ok()) {
          refused = absl::Status(st.code(), absl::StrCat("release ", request.seq(), ": lease ",
                                                         lease, ": expert ", s.expert, " (class ",
                                                         s.slot_class, "): ", st.message()));
          break;
        }
      }
      if (refused.ok()) {
        slots_ -= it->second.grant.slots.size();
        grant = std::move(it->second.grant);
        leases_.erase(it);
      }
    }
  }
  if (!refused.ok()) return Fail(request.seq(), refused);
  model_->engine().Release(grant);
}

void Session::HandleLane(const lane::Request& r) {
  switch (r.type) {
    case lane::RecordType::kAcquire: {
      v1::Acquire a;
      a.set_seq(r.seq);
      a.set_layer(r.layer);
      a.mutable_experts()->Add(r.experts.begin(), r.experts.end());
      return Acquire(a);
    }
    case lane::RecordType::kPrefetch:
      for (const lane::PrefetchGroup& g : r.groups) {
        v1::Prefetch p;
        p.set_layer(g.layer);
        p.mutable_experts()->Add(g.experts.begin(), g.experts.end());
        Prefetch(p);
      }
      return;
    case lane::RecordType::kHits:
      client_hits_.fetch_add(r.experts.size(), std::memory_order_relaxed);
      Touch();
      model_->engine().RecordClientHits(r.layer, r.experts);
      return;
    case lane::RecordType::kRelease:
      for (uint64_t lease : r.leases) {
        v1::Release rel;
        rel.set_seq(r.seq);
        rel.set_lease(lease);
        Release(rel);
      }
      return;
    default:
      return;  // the decoder accepts request types only
  }
}

void Session::Reclaim(const Grant& grant) {
  for (const GrantedSlot& s : grant.slots) {
    // Cannot fail for a slot this session was granted; a failure would only mean the copy
    // holds on the CPU until the slot's next declaration.
    (void)fences_[s.slot_class]->ForceDone(s.slot, s.generation);
  }
  model_->engine().Release(grant);
}

bool Session::WaitsForClient() const {
  return std::any_of(fences_.begin(), fences_.end(),
                     [](const std::unique_ptr<SessionFences>& f) { return f->WaitsForClient(); });
}

void Session::ClientGone() {
  for (const std::unique_ptr<SessionFences>& f : fences_) f->ClientGone();
}

std::vector<v1::SlotClassHandles> Session::Handles() const {
  std::vector<v1::SlotClassHandles> out = model_->handles();
  for (size_t i = 0; i < fence_handles_.size() && i < out.size(); ++i) {
    *out[i].mutable_fences() = fence_handles_[i];
  }
  return out;
}

SessionCounters Session::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  SessionCounters c = counters_;
  c.leases_held = static_cast<uint32_t>(leases_.size());
  return c;
}

v1::SessionStats Session::Stats() const {
  const SessionCounters c = counters();
  v1::SessionStats s;
  s.set_session(id_.substr(0, 8));
  s.set_client_name(client_name_);
  s.set_client_pid(peer_.pid);
  s.set_acquires(c.acquires);
  s.set_hits(c.hits);
  s.set_misses(c.misses);
  s.set_errors(c.errors);
  s.set_leases_held(c.leases_held);
  s.set_acquire_p50_us(c.stall.Quantile(0.50) / 1e3);
  s.set_acquire_p99_us(c.stall.Quantile(0.99) / 1e3);
  s.set_transport(lane_ ? "lane" : "stream");
  if (lane_) {
    *s.mutable_lane() = lane_->Stats();
    s.mutable_lane()->set_client_hits(client_hits_.load(std::memory_order_relaxed));
  }
  return s;
}

// ---- SessionRegistry -------------------------------------------------------------------------

SessionRegistry::SessionRegistry(SessionLimits limits) : limits_(limits) {
  reaper_ = std::thread([this] { ReaperLoop(); });
}

SessionRegistry::SessionRegistry(SessionLimits limits, const LaneOptions& lanes)
    : limits_(limits), lanes_(std::make_unique<LaneOptions>(lanes)) {
  reaper_ = std::thread([this] { ReaperLoop(); });
}

SessionRegistry::~SessionRegistry() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  reaper_.join();
  // Whatever is still held goes back to the engines, which outlive the registry.
  std::vector<std::shared_ptr<Session>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, s] : sessions_) all.push_back(s);
    for (Draining& d : ended_) all.push_back(d.session);
    sessions_.clear();
    ended_.clear();
    watched_.clear();
  }
  for (const std::shared_ptr<Session>& s : all) {
    if (s->lane_) {
      s->lane_->Stop();
      s->lane_->Join();
    }
    std::map<uint64_t, Session::Lease> leases;
    {
      std::lock_guard<std::mutex> lock(s->mu_);
      s->ended_ = true;
      s->outbox_.reset();
      leases.swap(s->leases_);
    }
    for (auto& [id, lease] : leases) s->Reclaim(lease.grant);
  }
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Open(ServedModel* model,
                                                               const Peer& peer,
                                                               std::string client_name,
                                                               v1::Transport transport) {
  client_name = ClientNameForStats(std::move(client_name));
  // Refused before anything is made for it (a lane, done fences: on CUDA one IPC event per
  // slot); checked again under the lock below.
  if (absl::Status room = Room(); !room.ok()) return room;
  std::shared_ptr<LaneServer> lane;
  if (transport != v1::TRANSPORT_STREAM) {
    if (lanes_ == nullptr || !lanes_->enabled || !peer.unix_socket) {
      if (transport == v1::TRANSPORT_LANE) {
        return absl::FailedPreconditionError(
            !peer.unix_socket ? "a request lane needs a session over the Unix socket"
                              : "this daemon offers no request lanes (lane.enabled = false)");
      }
    } else {
      // Client-side hits: the lane carries the session's pin words when the engine publishes
      // residency tables (lane.client_hits).
      LaneOptions options = *lanes_;
      options.geometry.pin_words = options.client_hits ? model->engine().PinWords() : 0;
      absl::StatusOr<std::shared_ptr<LaneServer>> made =
          LaneServer::Create(options, absl::StrCat("lane-", client_name));
      if (!made.ok()) {
        return absl::Status(made.status().code(),
                            absl::StrCat("request lane: ", made.status().message()));
      }
      lane = *std::move(made);
    }
  }
  // Session fences are made before the lock (one IPC event per slot: not instant).
  if (!model->session_fences()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", model->name(), ": its device gives sessions no done fences of their own"));
  }
  absl::StatusOr<std::vector<std::unique_ptr<SessionFences>>> f = model->CreateSessionFences();
  if (!f.ok()) return f.status();
  std::vector<std::unique_ptr<SessionFences>> fences = *std::move(f);
  std::vector<v1::FenceTableHandle> fence_handles;
  for (const std::unique_ptr<SessionFences>& table : fences) {
    absl::StatusOr<FenceExport> e = table->Export();
    if (!e.ok()) return e.status();
    fence_handles.push_back(ToFenceHandle(*e));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status room = RoomLocked(); !room.ok()) return room;
  std::shared_ptr<Session> s(
      new Session(this, NewSessionId(), model, peer, std::move(client_name)));
  s->fences_ = std::move(fences);
  s->fence_handles_ = std::move(fence_handles);
  s->lane_ = std::move(lane);
  if (s->lane_ && !s->lane_->pins().empty()) {
    if (absl::Status pinned = model->engine().AddPins(s->PinOwner(), s->lane_->pins());
        !pinned.ok()) {
      return absl::Status(pinned.code(), absl::StrCat("client-side hits: ", pinned.message()));
    }
  }
  sessions_.emplace(s->id(), s);
  return s;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Attach(
    const std::string& id, const Peer& peer, std::shared_ptr<Outbox> outbox,
    std::function<void(const absl::Status&)> end_stream) {
  std::shared_ptr<Session> attached;
  {
    absl::StatusOr<std::shared_ptr<Session>> s = AttachLocked(id, peer, std::move(outbox));
    if (!s.ok()) return s;
    attached = *std::move(s);
    std::lock_guard<std::mutex> slock(attached->mu_);
    attached->end_stream_ = end_stream;
  }
  if (const std::shared_ptr<LaneServer>& lane = attached->lane_) {
    lane->Unlink();  // the client mapped it before attaching
    std::weak_ptr<Session> weak = attached;
    lane->Start(
        [weak](const lane::Request& r) {
          if (std::shared_ptr<Session> s = weak.lock()) s->HandleLane(r);
        },
        [this, weak, end_stream](const absl::Status& why) {
          ++lane_failures_;
          std::shared_ptr<Session> s = weak.lock();
          if (s) {
            spdlog::error("session {} ({}, pid {}): failed: the client broke the lane protocol: {}",
                          s->id().substr(0, 8), s->client_name().empty() ? "-" : s->client_name(),
                          s->peer().pid, std::string(why.message()));
          }
          if (end_stream) {
            end_stream(absl::InvalidArgumentError(
                absl::StrCat("the session's request lane broke the protocol: ", why.message())));
          }
        });
  }
  return attached;
}

absl::Status SessionRegistry::Room() const {
  std::lock_guard<std::mutex> lock(mu_);
  return RoomLocked();
}

absl::Status SessionRegistry::RoomLocked() const {
  if (draining_) return absl::UnavailableError("the daemon is shutting down: no new sessions");
  if (sessions_.size() >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the daemon serves ", sessions_.size(), " sessions (limits.max_sessions); close one first"));
  }
  return absl::OkStatus();
}

void Session::SetPassed(std::vector<int> fds) {
  std::lock_guard<std::mutex> lock(mu_);
  passed_ = std::move(fds);
}

absl::StatusOr<std::pair<std::shared_ptr<Session>, std::vector<int>>> SessionRegistry::Passed(
    const std::string& id, const Peer& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError("unknown session id (never opened, ended, or not attached in time)");
  }
  const std::shared_ptr<Session>& s = it->second;
  if (peer.pid != s->peer_.pid || peer.uid != s->peer_.uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "session ", id.substr(0, 8), " was opened by pid ", s->peer_.pid, " uid ", s->peer_.uid,
        ", not pid ", peer.pid, " uid ", peer.uid));
  }
  std::lock_guard<std::mutex> slock(s->mu_);
  if (s->attached_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", id.substr(0, 8), " is attached: its descriptors are fetched before Attach"));
  }
  return std::make_pair(s, s->passed_);
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::AttachLocked(
    const std::string& id, const Peer& peer, std::shared_ptr<Outbox> outbox) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(
        "unknown session id (never opened, ended, or not attached within the attach timeout)");
  }
  const std::shared_ptr<Session>& s = it->second;
  if (!peer.unix_socket) {
    return absl::FailedPreconditionError(
        "sessions are attached over the Unix socket only (a TCP peer has no identity to check)");
  }
  if (peer.uid != s->peer_.uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "session ", id.substr(0, 8), " was opened by uid ", s->peer_.uid, ", not ", peer.uid));
  }
  std::lock_guard<std::mutex> slock(s->mu_);
  if (s->attached_) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", id.substr(0, 8), " already has a Session stream"));
  }
  s->attached_ = true;
  s->outbox_ = s->lane_ ? std::static_pointer_cast<Outbox>(s->lane_) : std::move(outbox);
  return s;
}

void SessionRegistry::End(const std::shared_ptr<Session>& session) {
  // The lane first: once its thread stopped, no request of this session starts any more, so
  // what is outstanding below is complete.
  if (session->lane_) {
    session->lane_->Stop();
    session->lane_->Join();
    // Its client's reads ended with it: a process that closed its session waited for its
    // kernels first (CUDA); one that died took its CUDA context with it.
    session->DropPins();
  }
  std::vector<Grant> now;
  std::vector<std::shared_ptr<Session>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session->id());
    if (it != sessions_.end() && it->second == session) sessions_.erase(it);
    std::lock_guard<std::mutex> slock(session->mu_);
    if (session->ended_) return;
    session->ended_ = true;
    session->outbox_.reset();
    // Leases whose done fences passed go back at once; the rest drain in the reaper.
    for (auto lit = session->leases_.begin(); lit != session->leases_.end();) {
      if (session->DonePassed(lit->second.grant)) {
        session->slots_ -= lit->second.grant.slots.size();
        now.push_back(std::move(lit->second.grant));
        lit = session->leases_.erase(lit);
      } else {
        ++lit;
      }
    }
    if (!session->leases_.empty() || session->pending_ > 0) {
      ended_.push_back({session, absl::Now() + limits_.lease_ttl});
    } else if (session->WaitsForClient() && !session->client_gone_) {
      watched_.push_back({session, absl::Now() + limits_.lease_ttl});
    }
    // Bounded: a client that ends sessions without giving their leases back (an open, acquire,
    // close loop) would otherwise leave one draining session (and its pidfd, and its slots)
    // per turn for lease_ttl. Past max_sessions, the oldest are reclaimed at the reaper's next
    // pass, as if their time was up.
    const size_t cap = limits_.max_sessions;
    for (size_t i = 0; ended_.size() > cap && i < ended_.size() - cap; ++i) {
      if (ended_[i].deadline == absl::InfinitePast()) continue;
      ended_[i].deadline = absl::InfinitePast();
      spdlog::warn("session {} ({}, pid {}): ended with leases not given back; reclaimed early: "
                   "more than limits.max_sessions ({}) ended sessions are draining",
                   ended_[i].session->id(), ended_[i].session->client_name().empty()
                                                ? "-" : ended_[i].session->client_name(),
                   ended_[i].session->peer().pid, cap);
    }
    while (watched_.size() > cap) {  // the oldest stop being watched: their records are not
      gone.push_back(watched_.front().session);  // waited for any more
      watched_.front().session->client_gone_ = true;
      watched_.erase(watched_.begin());
    }
  }
  // Their done passed in the client's own words: the table's done is raised on its behalf.
  for (const Grant& g : now) session->Reclaim(g);
  for (const std::shared_ptr<Session>& s : gone) s->ClientGone();
  Notify();
}

void SessionRegistry::BeginDrain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool SessionRegistry::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

size_t SessionRegistry::ended_sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_.size() + watched_.size();
}

uint64_t SessionRegistry::LeasesOutstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [id, s] : sessions_) {
    std::lock_guard<std::mutex> slock(s->mu_);
    n += s->leases_.size() + s->pending_;
  }
  for (const Draining& d : ended_) {
    std::lock_guard<std::mutex> slock(d.session->mu_);
    n += d.session->leases_.size() + d.session->pending_;
  }
  return n;
}

bool SessionRegistry::WaitDrained(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (LeasesOutstanding() > 0) {
    if (absl::Now() >= deadline) return false;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
  return true;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::Sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Session>> out;
  for (const auto& [id, s] : sessions_) out.push_back(s);
  return out;
}

size_t SessionRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

void SessionRegistry::Notify() { cv_.notify_all(); }

}  // namespace expertd
