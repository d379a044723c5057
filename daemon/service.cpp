#include "service.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lane_server.h"
#include "spdlog/spdlog.h"
#include "util/status.h"

namespace expertd {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

void PeerTable::Put(int fd, const Peer& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  by_fd_[fd] = peer;
}

std::optional<Peer> PeerTable::Lookup(const std::string& grpc_peer) const {
  if (grpc_peer.rfind("fd:", 0) == 0) {
    int fd = -1;
    if (!absl::SimpleAtoi(absl::string_view(grpc_peer).substr(3), &fd)) return std::nullopt;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_fd_.find(fd);
    if (it == by_fd_.end()) return std::nullopt;
    return it->second;
  }
  if (grpc_peer.rfind("ipv4:", 0) == 0 || grpc_peer.rfind("ipv6:", 0) == 0) return Peer{};
  return std::nullopt;
}

namespace {
// Compares a presented token with the secret in time that depends only on their lengths, so
// timing does not tell how many leading bytes were right.
bool SameSecret(std::string_view got, std::string_view want) {
  unsigned char diff = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < got.size(); ++i) {
    diff |= static_cast<unsigned char>(got[i] ^ want[i % std::max<size_t>(want.size(), 1)]);
  }
  return diff == 0 && !want.empty();
}
}  // namespace

absl::StatusOr<Peer> ExpertdService::Authenticate(grpc::CallbackServerContext* context) const {
  std::optional<Peer> peer = state_->peers->Lookup(context->peer());
  if (!peer.has_value()) {
    return absl::PermissionDeniedError(
        absl::StrCat("unrecognised connection ", context->peer()));
  }
  if (!peer->unix_socket && !state_->tcp_token.empty()) {
    const auto& md = context->client_metadata();
    auto it = md.find("authorization");
    const std::string want = "Bearer " + state_->tcp_token;
    if (it == md.end() || !SameSecret(std::string_view(it->second.data(), it->second.size()),
                                      want)) {
      return absl::UnauthenticatedError(
          "TCP calls need the header 'authorization: Bearer <token>' with the daemon's token");
    }
  }
  return *peer;
}

ServedModel* ExpertdService::FindModel(const std::string& name, const std::string& device,
                                       absl::Status* error) {
  std::lock_guard<std::mutex> lock(state_->models_mu);
  auto it = state_->models.find(name);
  if (it == state_->models.end() || it->second.empty()) {
    *error = absl::NotFoundError(
        absl::StrCat("no model named '", name, "' (ListModels shows the served ones)"));
    return nullptr;
  }
  if (device.empty()) return it->second.front();
  std::vector<std::string> on;
  for (ServedModel* m : it->second) {
    if (m->device_name() == device) return m;
    on.emplace_back(m->device_name());
  }
  *error = absl::InvalidArgumentError(absl::StrCat("device '", device, "' does not serve model ",
                                                   name, " (it is on ", absl::StrJoin(on, ", "),
                                                   ")"));
  return nullptr;
}

grpc::ServerUnaryReactor* ExpertdService::ListModels(grpc::CallbackServerContext* context,
                                                     const v1::ListModelsRequest*,
                                                     v1::ListModelsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Peer> peer = Authenticate(context);
  if (!peer.ok()) {
    reactor->Finish(ToGrpc(peer.status()));
    return reactor;
  }
  std::lock_guard<std::mutex> lock(state_->models_mu);
  for (const auto& [name, on] : state_->models) *response->add_models() = on.front()->info();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

namespace {

// Numbers the objects of an OpenSession answer that have no name (memfds) in the order the
// handle socket sends them (SharedMemory.passed, 1-based) and returns their descriptors.
std::vector<int> MarkPassed(v1::OpenSessionResponse* response) {
  std::vector<int> fds;
  const auto mark = [&fds](v1::SharedMemory* m) {
    if (!m->shm_name().empty() || !m->cuda_ipc_handle().empty() || m->fd() < 0) return;
    fds.push_back(m->fd());
    m->set_passed(static_cast<uint32_t>(fds.size()));
  };
  for (v1::SlotClassHandles& h : *response->mutable_slot_classes()) {
    for (v1::ArenaHandle& a : *h.mutable_arenas()) mark(a.mutable_memory());
    if (h.has_residency()) mark(h.mutable_residency()->mutable_memory());
    if (h.has_fences()) {
      mark(h.mutable_fences()->mutable_memory());
      if (h.fences().has_session_done()) mark(h.mutable_fences()->mutable_session_done());
    }
  }
  if (response->has_lane()) mark(response->mutable_lane()->mutable_memory());
  return fds;
}

}  // namespace

grpc::ServerUnaryReactor* ExpertdService::OpenSession(grpc::CallbackServerContext* context,
                                                      const v1::OpenSessionRequest* request,
                                                      v1::OpenSessionResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const auto finish = [&](const absl::Status& st) {
    reactor->Finish(ToGrpc(st));
    return reactor;
  };
  absl::StatusOr<Peer> peer = Authenticate(context);
  if (!peer.ok()) return finish(peer.status());
  if (!peer->unix_socket) {
    return finish(absl::FailedPreconditionError(
        "sessions are opened over the Unix socket only: TCP never carries shared-memory or IPC "
        "handles"));
  }
  if (!state_->serving.load()) {
    return finish(absl::UnavailableError(
        state_->sessions->draining() ? "the daemon is shutting down" : "the daemon is starting"));
  }
  absl::Status missing;
  ServedModel* model = FindModel(request->model(), request->device(), &missing);
  if (model == nullptr) return finish(missing);
  absl::StatusOr<std::shared_ptr<expertd::Session>> s =
      state_->sessions->Open(model, *peer, request->client_name(), request->transport());
  if (!s.ok()) return finish(s.status());
  response->set_session_id((*s)->id());
  *response->mutable_model() = model->info();
  response->set_device(std::string(model->device_name()));
  response->set_device_kind(model->device_kind());
  response->set_device_uuid(model->device_uuid());
  for (v1::SlotClassHandles& h : (*s)->Handles()) *response->add_slot_classes() = std::move(h);
  if ((*s)->lane()) *response->mutable_lane() = (*s)->lane()->handle();
  std::vector<int> passed = MarkPassed(response);
  if (!passed.empty()) {
    if (state_->handle_socket.empty()) {
      state_->sessions->End(*s);
      return finish(absl::FailedPreconditionError(
          "this daemon has memfd objects but no handle socket to pass them on"));
    }
    response->set_handle_socket(state_->handle_socket);
    (*s)->SetPassed(std::move(passed));
  }
  const SessionLimits& l = state_->sessions->limits();
  v1::SessionLimits* out = response->mutable_limits();
  out->set_max_leases(l.max_leases_per_session);
  out->set_max_experts_per_acquire(l.max_experts_per_acquire);
  out->set_max_slots(SlotsPerSession(l, *model));
  out->set_lease_ttl_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(l.lease_ttl)));
  out->set_attach_timeout_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(l.attach_timeout)));
  out->set_max_message_bytes(l.max_message_bytes);
  return finish(absl::OkStatus());
}

namespace {

void AddModelStats(const std::string& name, const ServedModel& model,
                   const std::vector<std::shared_ptr<expertd::Session>>& sessions,
                   v1::ModelStats* m) {
  const EngineStats e = model.engine().Stats();
  m->set_model(name);
  m->set_device(std::string(model.device_name()));
  m->set_accesses(e.pool.accesses);
  m->set_hits(e.pool.hits);
  m->set_joins(e.pool.joins);
  m->set_misses(e.pool.misses);
  m->set_evictions(e.pool.evictions);
  m->set_prefetch_issued(e.pool.prefetch_issued);
  m->set_prefetch_used(e.pool.prefetch_used);
  m->set_prefetch_wasted(e.pool.prefetch_wasted);
  m->set_prefetch_dropped(e.pool.prefetch_dropped);
  m->set_bytes_read(e.bytes_read);
  m->set_bytes_copied(e.bytes_copied);
  m->set_bytes_direct(e.bytes_direct);
  m->set_client_hits(e.pool.client_hits);
  m->set_pinned_skips(e.pool.pinned_skips);
  m->set_fills_failed(e.fills_failed);
  m->set_stall_p50_us(e.stall_p50_us);
  m->set_stall_p99_us(e.stall_p99_us);
  for (const auto& [label, bytes] : model.PackBytesRead()) {
    v1::ByteCount* b = m->add_pack_bytes_read();
    b->set_name(label);
    b->set_bytes(bytes);
  }
  for (const std::shared_ptr<expertd::Session>& s : sessions) {
    if (&s->model() == &model) *m->add_sessions() = s->Stats();
  }
}

}  // namespace

grpc::ServerUnaryReactor* ExpertdService::GetStats(grpc::CallbackServerContext* context,
                                                   const v1::GetStatsRequest* request,
                                                   v1::GetStatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Peer> peer = Authenticate(context);
  if (!peer.ok()) {
    reactor->Finish(ToGrpc(peer.status()));
    return reactor;
  }
  std::vector<std::shared_ptr<expertd::Session>> sessions = state_->sessions->Sessions();
  std::lock_guard<std::mutex> lock(state_->models_mu);
  if (!request->model().empty() && state_->models.count(request->model()) == 0) {
    reactor->Finish(ToGrpc(absl::NotFoundError(absl::StrCat("no model named '", request->model(),
                                                            "'"))));
    return reactor;
  }
  for (const auto& [name, on] : state_->models) {
    if (!request->model().empty() && request->model() != name) continue;
    for (ServedModel* model : on) AddModelStats(name, *model, sessions, response->add_models());
  }
  response->set_sessions(static_cast<uint32_t>(sessions.size()));
  response->set_uptime_ms(
      static_cast<uint64_t>(absl::ToInt64Milliseconds(absl::Now() - state_->started_at)));
  if (!state_->device_names.empty()) response->set_device(state_->device_names.front());
  for (const std::string& d : state_->device_names) response->add_devices(d);
  response->set_draining(state_->sessions->draining());
  response->set_leases_outstanding(state_->sessions->LeasesOutstanding());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

// ---- The Session stream ----------------------------------------------------------------------

namespace {

using SessionReactorBase = grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>;

// The stream's write queue. gRPC allows one write in flight per stream, so replies queue here;
// engine threads push grants, the reactor's OnWriteDone starts the next write. Once closed, pushes
// are dropped, so nothing touches the reactor after it finished.
class StreamOutbox final : public Outbox {
 public:
  // Answers a stream may have queued: a client that does not read its stream (gRPC's flow
  // control then holds every write) has it cancelled instead of growing the queue without bound.
  static constexpr size_t kMaxQueued = 4096;

  StreamOutbox(SessionReactorBase* reactor, grpc::CallbackServerContext* context)
      : reactor_(reactor), context_(context) {}

  bool Push(v1::SessionResponse message) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    if (queue_.size() >= kMaxQueued) {
      spdlog::warn("a Session stream's client does not read it: {} answers queued; cancelling the "
                   "stream (its session ends)", queue_.size());
      closed_ = true;
      queue_.erase(queue_.begin() + 1, queue_.end());  // front() is being written
      context_->TryCancel();
      return false;
    }
    queue_.push_back(std::move(message));
    if (!writing_) {
      writing_ = true;
      reactor_->StartWrite(&queue_.front());
    }
    return true;
  }
  // After a write: starts the next one. Returns true when the stream may finish now (closing
  // was requested and nothing is left to write).
  bool WriteDone(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.pop_front();
    if (!ok) {
      queue_.clear();
      closed_ = true;
    }
    if (!queue_.empty() && !closed_) {
      reactor_->StartWrite(&queue_.front());
      return false;
    }
    writing_ = false;
    if (closing_ && !finished_) {
      finished_ = true;
      closed_ = true;
      return true;
    }
    return false;
  }
  // The read side ended: finish once queued writes are out. True when the caller finishes now.
  bool Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    if (writing_ || finished_) return false;
    finished_ = true;
    closed_ = true;
    return true;
  }
  void Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  // Ends the stream with `status` from any thread (the session's lane failed): at once, or after
  // the write in flight. Nothing happens once the stream is closing.
  void Fail(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_ || closed_) return;
    status_ = std::move(status);
    closing_ = true;
    if (writing_) return;
    finished_ = true;
    closed_ = true;
    reactor_->Finish(status_);
  }
  // The status to finish with: OK unless Fail or SetStatus set one.
  grpc::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  void SetStatus(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = std::move(status);
  }

 private:
  std::mutex mu_;
  SessionReactorBase* const reactor_;
  grpc::CallbackServerContext* const context_;
  std::deque<v1::SessionResponse> queue_;  // front() is being written while writing_
  bool writing_ = false;
  bool closing_ = false;
  bool finished_ = false;
  bool closed_ = false;
  grpc::Status status_ = grpc::Status::OK;
};

class SessionReactor final : public SessionReactorBase {
 public:
  SessionReactor(ServiceState* state, grpc::CallbackServerContext* context,
                 absl::StatusOr<Peer> peer)
      : state_(state), peer_(std::move(peer)),
        outbox_(std::make_shared<StreamOutbox>(this, context)) {
    if (!peer_.ok()) {
      outbox_->SetStatus(ToGrpc(peer_.status()));
      Close();
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed, cancelled or vanished
      Close();
      return;
    }
    absl::Status st = Handle();
    if (!st.ok()) {
      outbox_->SetStatus(ToGrpc(st));
      Close();
      return;
    }
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    if (outbox_->WriteDone(ok)) Finish(outbox_->status());
  }

  void OnCancel() override { outbox_->Cancel(); }

  void OnDone() override {
    EndSession();
    delete this;
  }

 private:
  // One request. A non-OK status ends the stream (protocol violations); request errors go back
  // as RequestError messages and the stream goes on.
  absl::Status Handle() {
    if (!session_) {
      if (!request_.has_attach()) {
        return absl::FailedPreconditionError("the first message of a Session stream is Attach");
      }
      std::weak_ptr<StreamOutbox> stream = outbox_;
      absl::StatusOr<std::shared_ptr<expertd::Session>> s = state_->sessions->Attach(
          request_.attach().session_id(), *peer_, outbox_, [stream](const absl::Status& why) {
            if (std::shared_ptr<StreamOutbox> o = stream.lock()) o->Fail(ToGrpc(why));
          });
      if (!s.ok()) return s.status();
      session_ = *std::move(s);
      v1::SessionResponse r;
      r.mutable_attached()->set_session_id(session_->id());
      outbox_->Push(std::move(r));
      return absl::OkStatus();
    }
    switch (request_.kind_case()) {
      case v1::SessionRequest::kAcquire:
        session_->Acquire(request_.acquire());
        return absl::OkStatus();
      case v1::SessionRequest::kPrefetch:
        session_->Prefetch(request_.prefetch());
        return absl::OkStatus();
      case v1::SessionRequest::kRelease:
        session_->Release(request_.release());
        return absl::OkStatus();
      case v1::SessionRequest::kAttach:
        return absl::FailedPreconditionError("the stream is already attached to a session");
      default:
        return absl::InvalidArgumentError("empty SessionRequest");
    }
  }

  void Close() {
    EndSession();
    if (outbox_->Close()) Finish(outbox_->status());
  }

  void EndSession() {
    std::shared_ptr<expertd::Session> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = std::move(session_);
      session_.reset();
    }
    if (s) state_->sessions->End(s);
  }

  ServiceState* const state_;
  const absl::StatusOr<Peer> peer_;
  std::shared_ptr<StreamOutbox> outbox_;
  v1::SessionRequest request_;
  std::mutex mu_;
  std::shared_ptr<expertd::Session> session_;
};

}  // namespace

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* ExpertdService::Session(
    grpc::CallbackServerContext* context) {
  return new SessionReactor(state_, context, Authenticate(context));
}

}  // namespace expertd
