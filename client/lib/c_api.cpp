// The C API (expertd_client.h) over the C++ client (client.h). Every entry point checks its
// pointer arguments, then runs its body inside Guard, which turns any exception into an
// INTERNAL error object: nothing unwinds into C.
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client.h"
#include "expertd_client.h"

namespace ec = expertd::client;
namespace v1 = expertd::v1;

struct EXPERTD_Error {
  EXPERTD_Error_Code code;
  std::string message;
};

namespace {

// Returned when not even an error object can be allocated; EXPERTD_ErrorDelete skips it.
EXPERTD_Error out_of_memory{EXPERTD_ERROR_RESOURCE_EXHAUSTED, "out of memory"};

constexpr const char* kCodeNames[] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

EXPERTD_Error_Code ToCode(int code) {
  return code >= EXPERTD_ERROR_CANCELLED && code <= EXPERTD_ERROR_UNAUTHENTICATED
             ? static_cast<EXPERTD_Error_Code>(code)
             : EXPERTD_ERROR_UNKNOWN;
}

EXPERTD_Error* MakeError(EXPERTD_Error_Code code, absl::string_view message) noexcept {
  try {
    return new EXPERTD_Error{ToCode(code), std::string(message)};
  } catch (...) {
    return &out_of_memory;
  }
}

EXPERTD_Error* FromStatus(const absl::Status& status) noexcept {
  if (status.ok()) return nullptr;
  return MakeError(ToCode(static_cast<int>(status.code())), status.message());
}

EXPERTD_Error* InternalError(const char* fn, const char* what) noexcept {
  try {
    return MakeError(EXPERTD_ERROR_INTERNAL, absl::StrCat(fn, ": internal error: ", what));
  } catch (...) {
    return &out_of_memory;
  }
}

EXPERTD_Error* Invalid(const char* fn, std::string_view what) noexcept {
  try {
    return MakeError(EXPERTD_ERROR_INVALID_ARGUMENT,
                     absl::StrCat(fn, ": ", absl::string_view(what.data(), what.size())));
  } catch (...) {
    return &out_of_memory;
  }
}

// Argument checks: NotNull(__func__, {ARG(session), ARG(out)}).
#define ARG(x) std::pair<const char*, const void*>(#x, static_cast<const void*>(x))
EXPERTD_Error* NotNull(const char* fn,
                       std::initializer_list<std::pair<const char*, const void*>> args) noexcept {
  for (const auto& [name, value] : args) {
    if (value == nullptr) {
      try {
        return Invalid(fn, absl::StrCat("argument '", name, "' is NULL"));
      } catch (...) {
        return &out_of_memory;
      }
    }
  }
  return nullptr;
}

template <typename F>
EXPERTD_Error* Guard(const char* fn, F&& body) noexcept {
  try {
    return body(fn);
  } catch (const std::bad_alloc&) {
    return &out_of_memory;
  } catch (const std::exception& e) {
    return InternalError(fn, e.what());
  } catch (...) {
    return InternalError(fn, "unknown exception");
  }
}

// ---- Arena mappings ---------------------------------------------------------------------------
// The C API hands out arena base pointers, which the C++ Session does not expose, so it maps each
// arena itself (read-only, shared by all C sessions of this process) and computes every slot
// pointer from that one mapping: base + slot * stride, the same address an engine's tensor sees.


// The C++ session's mapping of one arena (kept alive by `map`, also after the session is gone).
struct ArenaView {
  std::shared_ptr<const void> map;
  const uint8_t* base = nullptr;
  uint64_t stride = 0;
  uint32_t slots = 0;
};

}  // namespace

// ---- Handles -----------------------------------------------------------------------------------

struct EXPERTD_Client {
  std::unique_ptr<ec::Client> client;
  std::vector<v1::ModelInfo> models;  // the last ListModels answer
  bool listed = false;
};

namespace {

// What a session and its leases share: a lease may outlive its EXPERTD_Session object (it is then
// only freed), and its pointers stay inside live mappings until it is.
struct SessionState {
  std::mutex mu;
  std::unique_ptr<ec::Session> session;        // null once EXPERTD_SessionDelete ran
  std::vector<std::vector<ArenaView>> arenas;  // [slot class][projection]
  std::map<uint32_t, uint32_t> layer_class;
};

}  // namespace

struct EXPERTD_Session {
  std::shared_ptr<SessionState> state;
};

struct EXPERTD_Lease {
  std::shared_ptr<SessionState> state;
  ec::Lease lease;
};

namespace {

const v1::ModelInfo* CachedModel(EXPERTD_Client* client, size_t index, const char* fn,
                                 EXPERTD_Error** error) {
  if (!client->listed) {
    *error = Invalid(fn, "no model list yet: call EXPERTD_ClientListModels first");
    return nullptr;
  }
  if (index >= client->models.size()) {
    *error = Invalid(fn, absl::StrCat("model index ", index, " is past the ", client->models.size(),
                                      " listed models"));
    return nullptr;
  }
  return &client->models[index];
}

const v1::ModelInfo& Model(const EXPERTD_Session* s) { return s->state->session->model(); }

EXPERTD_Error* CheckClass(const char* fn, const SessionState& st, uint32_t slot_class,
                          uint32_t projection) {
  if (slot_class >= st.arenas.size()) {
    return Invalid(fn, absl::StrCat("slot class ", slot_class, " out of range (the model has ",
                                    st.arenas.size(), ")"));
  }
  if (projection >= st.arenas[slot_class].size()) {
    return Invalid(fn, absl::StrCat("projection ", projection, " out of range (slot class ",
                                    slot_class, " has ", st.arenas[slot_class].size(), ")"));
  }
  return nullptr;
}

// Releases and frees `lease` (owned from here on). A lease whose session was deleted is only freed.
EXPERTD_Error* ReleaseAndFree(EXPERTD_Lease* lease, bool wake = true) {
  std::unique_ptr<EXPERTD_Lease> owned(lease);
  std::shared_ptr<SessionState> st = owned->state;
  std::lock_guard<std::mutex> lock(st->mu);
  if (!st->session) return nullptr;
  return FromStatus(wake ? st->session->Release(owned->lease)
                         : st->session->ReleaseLater(owned->lease));
}

// EXPERTD_SessionRelease and EXPERTD_SessionReleaseLater: checks the arguments, then
// ReleaseAndFree.
EXPERTD_Error* ReleaseOfSession(const char* fn, EXPERTD_Session* session, EXPERTD_Lease* lease,
                                bool wake) {
  if (auto* e = NotNull(fn, {ARG(session), ARG(lease)})) return e;
  if (lease->state != session->state) {
    return Invalid(fn, "the lease belongs to another session");
  }
  return Guard(fn, [&](const char*) -> EXPERTD_Error* { return ReleaseAndFree(lease, wake); });
}

}  // namespace

extern "C" {

// ---- Errors ------------------------------------------------------------------------------------

EXPERTD_Error* EXPERTD_ErrorNew(EXPERTD_Error_Code code, const char* message) {
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    return MakeError(code, message ? message : "");
  });
}

void EXPERTD_ErrorDelete(EXPERTD_Error* error) {
  if (error != &out_of_memory) delete error;
}

EXPERTD_Error_Code EXPERTD_ErrorCode(const EXPERTD_Error* error) {
  return error ? error->code : EXPERTD_ERROR_INVALID_ARGUMENT;
}

const char* EXPERTD_ErrorCodeString(const EXPERTD_Error* error) {
  return error ? kCodeNames[error->code] : kCodeNames[0];
}

const char* EXPERTD_ErrorMessage(const EXPERTD_Error* error) {
  return error ? error->message.c_str() : "";
}

// ---- Version -----------------------------------------------------------------------------------

EXPERTD_Error* EXPERTD_ApiVersion(uint32_t* major, uint32_t* minor) {
  if (auto* e = NotNull(__func__, {ARG(major), ARG(minor)})) return e;
  *major = EXPERTD_CLIENT_API_VERSION_MAJOR;
  *minor = EXPERTD_CLIENT_API_VERSION_MINOR;
  return nullptr;
}

// ---- Client ------------------------------------------------------------------------------------

EXPERTD_Error* EXPERTD_ClientNewWithTimeout(EXPERTD_Client** client, const char* address,
                                            const char* token, int64_t connect_timeout_ms) {
  if (auto* e = NotNull(__func__, {ARG(client), ARG(address)})) return e;
  if (connect_timeout_ms <= 0) return Invalid(__func__, "connect_timeout_ms must be > 0");
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    ec::ConnectOptions options;
    options.address = address;
    options.token = token ? token : "";
    options.connect_timeout = absl::Milliseconds(connect_timeout_ms);
    absl::StatusOr<std::unique_ptr<ec::Client>> c = ec::Client::Connect(options);
    if (!c.ok()) return FromStatus(c.status());
    auto handle = std::make_unique<EXPERTD_Client>();
    handle->client = *std::move(c);
    *client = handle.release();
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_ClientNew(EXPERTD_Client** client, const char* address, const char* token) {
  return EXPERTD_ClientNewWithTimeout(client, address, token, 5000);
}

EXPERTD_Error* EXPERTD_ClientDelete(EXPERTD_Client* client) {
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    delete client;
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_ClientHealth(EXPERTD_Client* client, const char* service, bool* serving) {
  if (auto* e = NotNull(__func__, {ARG(client), ARG(serving)})) return e;
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    absl::StatusOr<bool> s = client->client->Health(service ? service : "");
    if (!s.ok()) return FromStatus(s.status());
    *serving = *s;
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_ClientListModels(EXPERTD_Client* client, size_t* count) {
  if (auto* e = NotNull(__func__, {ARG(client), ARG(count)})) return e;
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    absl::StatusOr<std::vector<v1::ModelInfo>> models = client->client->ListModels();
    if (!models.ok()) return FromStatus(models.status());
    client->models = *std::move(models);
    client->listed = true;
    *count = client->models.size();
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_ClientModelName(EXPERTD_Client* client, size_t index, const char** name) {
  if (auto* e = NotNull(__func__, {ARG(client), ARG(name)})) return e;
  return Guard(__func__, [&](const char* fn) -> EXPERTD_Error* {
    EXPERTD_Error* error = nullptr;
    const v1::ModelInfo* m = CachedModel(client, index, fn, &error);
    if (m == nullptr) return error;
    *name = m->name().c_str();
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_ClientModelArchitecture(EXPERTD_Client* client, size_t index,
                                               const char** architecture) {
  if (auto* e = NotNull(__func__, {ARG(client), ARG(architecture)})) return e;
  return Guard(__func__, [&](const char* fn) -> EXPERTD_Error* {
    EXPERTD_Error* error = nullptr;
    const v1::ModelInfo* m = CachedModel(client, index, fn, &error);
    if (m == nullptr) return error;
    *architecture = m->architecture().c_str();
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_ClientModelExperts(EXPERTD_Client* client, size_t index, uint32_t* n_expert,
                                          uint32_t* n_expert_used) {
  if (auto* e = NotNull(__func__, {ARG(client), ARG(n_expert), ARG(n_expert_used)})) return e;
  return Guard(__func__, [&](const char* fn) -> EXPERTD_Error* {
    EXPERTD_Error* error = nullptr;
    const v1::ModelInfo* m = CachedModel(client, index, fn, &error);
    if (m == nullptr) return error;
    *n_expert = m->n_expert();
    *n_expert_used = m->n_expert_used();
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_ClientModelMoeLayers(EXPERTD_Client* client, size_t index,
                                            const uint32_t** layers, size_t* count) {
  if (auto* e = NotNull(__func__, {ARG(client), ARG(layers), ARG(count)})) return e;
  return Guard(__func__, [&](const char* fn) -> EXPERTD_Error* {
    EXPERTD_Error* error = nullptr;
    const v1::ModelInfo* m = CachedModel(client, index, fn, &error);
    if (m == nullptr) return error;
    *count = static_cast<size_t>(m->moe_layers_size());
    *layers = m->moe_layers().empty() ? nullptr : m->moe_layers().data();
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_ClientModelExpertBytes(EXPERTD_Client* client, size_t index,
                                              uint64_t* bytes) {
  if (auto* e = NotNull(__func__, {ARG(client), ARG(bytes)})) return e;
  return Guard(__func__, [&](const char* fn) -> EXPERTD_Error* {
    EXPERTD_Error* error = nullptr;
    const v1::ModelInfo* m = CachedModel(client, index, fn, &error);
    if (m == nullptr) return error;
    *bytes = m->expert_bytes_total();
    return nullptr;
  });
}

// ---- Session -----------------------------------------------------------------------------------

namespace {

EXPERTD_Error* OpenSession(const char* func, EXPERTD_Session** session, EXPERTD_Client* client,
                           const char* model, const char* client_name,
                           ec::SessionOptions::Transport transport) {
  return Guard(func, [&](const char* fn) -> EXPERTD_Error* {
    ec::SessionOptions options;
    options.model = model;
    options.client_name = client_name ? client_name : "";
    options.transport = transport;
    absl::StatusOr<std::unique_ptr<ec::Session>> s = client->client->OpenSession(options);
    if (!s.ok()) return FromStatus(s.status());
    auto state = std::make_shared<SessionState>();
    const v1::ModelInfo& info = (*s)->model();
    const v1::OpenSessionResponse& open = (*s)->info();
    if (open.slot_classes_size() != info.slot_classes_size()) {
      return MakeError(EXPERTD_ERROR_INTERNAL,
                       absl::StrCat(fn, ": the daemon sent handles for ", open.slot_classes_size(),
                                    " of ", info.slot_classes_size(), " slot classes"));
    }
    for (int c = 0; c < info.slot_classes_size(); ++c) {
      const v1::SlotClass& sc = info.slot_classes(c);
      const v1::SlotClassHandles& h = open.slot_classes(c);
      if (sc.id() != static_cast<uint32_t>(c) || h.arenas_size() != sc.projections_size()) {
        return MakeError(EXPERTD_ERROR_INTERNAL,
                         absl::StrCat(fn, ": slot class ", c, " has ", h.arenas_size(),
                                      " arenas for ", sc.projections_size(), " projections"));
      }
      for (uint32_t layer : sc.layers()) state->layer_class[layer] = static_cast<uint32_t>(c);
      std::vector<ArenaView> views;
      for (int p = 0; p < h.arenas_size(); ++p) {
        absl::StatusOr<ec::ArenaRef> m =
            (*s)->arena(static_cast<uint32_t>(c), static_cast<uint32_t>(p));
        if (!m.ok()) return FromStatus(m.status());
        ArenaView v;
        v.stride = m->stride;
        v.slots = m->slots;
        // Host: an address in this process; CUDA: a device pointer in this process.
        const uint64_t size = m->device_ptr != nullptr ? m->device_bytes : m->bytes.size();
        if (v.stride == 0 || size / v.stride < v.slots) {
          return MakeError(EXPERTD_ERROR_INTERNAL,
                           absl::StrCat(fn, ": arena '", h.arenas(p).label(), "' of ", size,
                                        " bytes cannot hold ", v.slots, " slots of ", v.stride,
                                        " bytes"));
        }
        v.base = m->device_ptr != nullptr ? static_cast<const uint8_t*>(m->device_ptr)
                                          : m->bytes.data();
        v.map = std::move(m->keep_alive);
        views.push_back(std::move(v));
      }
      state->arenas.push_back(std::move(views));
    }
    state->session = *std::move(s);
    *session = new EXPERTD_Session{std::move(state)};
    return nullptr;
  });
}

}  // namespace

EXPERTD_Error* EXPERTD_SessionNew(EXPERTD_Session** session, EXPERTD_Client* client,
                                  const char* model, const char* client_name) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(client), ARG(model)})) return e;
  return OpenSession(__func__, session, client, model, client_name,
                     ec::SessionOptions::Transport::kAuto);
}

EXPERTD_Error* EXPERTD_SessionNewWithTransport(EXPERTD_Session** session, EXPERTD_Client* client,
                                               const char* model, const char* client_name,
                                               const char* transport) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(client), ARG(model), ARG(transport)})) {
    return e;
  }
  const std::string t = transport;
  if (t != "auto" && t != "lane" && t != "stream") {
    return MakeError(EXPERTD_ERROR_INVALID_ARGUMENT,
                     absl::StrCat(__func__, ": transport '", t, "': auto, lane or stream"));
  }
  return OpenSession(__func__, session, client, model, client_name,
                     t == "lane"     ? ec::SessionOptions::Transport::kLane
                     : t == "stream" ? ec::SessionOptions::Transport::kStream
                                     : ec::SessionOptions::Transport::kAuto);
}

EXPERTD_Error* EXPERTD_SessionTransport(EXPERTD_Session* session, const char** transport) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(transport)})) return e;
  *transport = session->state->session->transport() == "lane" ? "lane" : "stream";
  return nullptr;
}

EXPERTD_Error* EXPERTD_SessionDelete(EXPERTD_Session* session) {
  if (session == nullptr) return nullptr;
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    std::unique_ptr<EXPERTD_Session> owned(session);
    std::unique_ptr<ec::Session> s;
    {
      std::lock_guard<std::mutex> lock(owned->state->mu);
      s = std::move(owned->state->session);
    }
    s.reset();  // ends the stream: the daemon releases what is still leased
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_SessionDevice(EXPERTD_Session* session, const char** device,
                                     const char** kind) {
  if (auto* e = NotNull(__func__, {ARG(session)})) return e;
  const v1::OpenSessionResponse& info = session->state->session->info();
  if (device) *device = info.device().c_str();
  if (kind) *kind = info.device_kind().c_str();
  return nullptr;
}

EXPERTD_Error* EXPERTD_SessionCudaDevice(EXPERTD_Session* session, int* ordinal) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(ordinal)})) return e;
  *ordinal = session->state->session->cuda_device();
  return nullptr;
}

EXPERTD_Error* EXPERTD_SessionLimits(EXPERTD_Session* session, uint32_t* max_leases,
                                     uint32_t* max_experts_per_acquire, uint64_t* lease_ttl_ms) {
  if (auto* e = NotNull(__func__, {ARG(session)})) return e;
  const v1::SessionLimits& l = session->state->session->info().limits();
  if (max_leases) *max_leases = l.max_leases();
  if (max_experts_per_acquire) *max_experts_per_acquire = l.max_experts_per_acquire();
  if (lease_ttl_ms) *lease_ttl_ms = l.lease_ttl_ms();
  return nullptr;
}

EXPERTD_Error* EXPERTD_SessionExperts(EXPERTD_Session* session, uint32_t* n_expert,
                                      uint32_t* n_expert_used) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(n_expert), ARG(n_expert_used)})) return e;
  *n_expert = Model(session).n_expert();
  *n_expert_used = Model(session).n_expert_used();
  return nullptr;
}

EXPERTD_Error* EXPERTD_SessionMoeLayers(EXPERTD_Session* session, const uint32_t** layers,
                                        size_t* count) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(count)})) return e;
  const auto& l = Model(session).moe_layers();
  *count = static_cast<size_t>(l.size());
  if (layers) *layers = l.empty() ? nullptr : l.data();
  return nullptr;
}

EXPERTD_Error* EXPERTD_SessionSlotClassCount(EXPERTD_Session* session, uint32_t* count) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(count)})) return e;
  *count = static_cast<uint32_t>(session->state->arenas.size());
  return nullptr;
}

EXPERTD_Error* EXPERTD_SessionLayerSlotClass(EXPERTD_Session* session, uint32_t layer,
                                             uint32_t* slot_class) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(slot_class)})) return e;
  return Guard(__func__, [&](const char* fn) -> EXPERTD_Error* {
    const auto it = session->state->layer_class.find(layer);
    if (it == session->state->layer_class.end()) {
      return Invalid(
          fn, absl::StrCat("layer ", layer, " is not an MoE layer of ", Model(session).name()));
    }
    *slot_class = it->second;
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_SessionProjectionCount(EXPERTD_Session* session, uint32_t slot_class,
                                              uint32_t* count) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(count)})) return e;
  return Guard(__func__, [&](const char* fn) -> EXPERTD_Error* {
    if (slot_class >= session->state->arenas.size()) {
      return Invalid(fn, absl::StrCat("slot class ", slot_class, " out of range (the model has ",
                                      session->state->arenas.size(), ")"));
    }
    *count = static_cast<uint32_t>(session->state->arenas[slot_class].size());
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_SessionProjection(EXPERTD_Session* session, uint32_t slot_class,
                                         uint32_t projection, const char** kind,
                                         const char** type_name, uint32_t* type_id, uint64_t* ne0,
                                         uint64_t* ne1, uint64_t* expert_bytes) {
  if (auto* e = NotNull(__func__, {ARG(session)})) return e;
  return Guard(__func__, [&](const char* fn) -> EXPERTD_Error* {
    if (EXPERTD_Error* e = CheckClass(fn, *session->state, slot_class, projection)) return e;
    const v1::Projection& p = Model(session).slot_classes(slot_class).projections(projection);
    if (kind) *kind = p.kind().c_str();
    if (type_name) *type_name = p.type().c_str();
    if (type_id) *type_id = p.type_id();
    if (ne0) *ne0 = p.ne0();
    if (ne1) *ne1 = p.ne1();
    if (expert_bytes) *expert_bytes = p.expert_bytes();
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_SessionArena(EXPERTD_Session* session, uint32_t slot_class,
                                    uint32_t projection, const void** base, uint64_t* slot_stride,
                                    uint32_t* slot_count) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(base), ARG(slot_stride), ARG(slot_count)})) {
    return e;
  }
  return Guard(__func__, [&](const char* fn) -> EXPERTD_Error* {
    if (EXPERTD_Error* e = CheckClass(fn, *session->state, slot_class, projection)) return e;
    const ArenaView& v = session->state->arenas[slot_class][projection];
    *base = v.base;
    *slot_stride = v.stride;
    *slot_count = v.slots;
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_SessionAcquire(EXPERTD_Session* session, uint32_t layer,
                                      const uint32_t* experts, size_t n, int64_t timeout_ms,
                                      EXPERTD_Lease** lease) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(experts), ARG(lease)})) return e;
  if (n == 0) return Invalid(__func__, "no experts (n == 0)");
  if (timeout_ms <= 0) return Invalid(__func__, "timeout_ms must be > 0");
  return Guard(__func__, [&](const char* fn) -> EXPERTD_Error* {
    const std::shared_ptr<SessionState>& st = session->state;
    absl::StatusOr<ec::Lease> l = st->session->Acquire(layer, std::span<const uint32_t>(experts, n),
                                                       absl::Milliseconds(timeout_ms));
    if (!l.ok()) return FromStatus(l.status());
    auto handle = std::make_unique<EXPERTD_Lease>();
    handle->state = st;
    handle->lease = *std::move(l);
    for (const ec::SlotView& s : handle->lease.slots) {
      if (s.slot_class >= st->arenas.size() ||
          (!st->arenas[s.slot_class].empty() && s.slot >= st->arenas[s.slot_class][0].slots)) {
        EXPERTD_Error* bad =
            MakeError(EXPERTD_ERROR_INTERNAL,
                      absl::StrCat(fn, ": the grant names slot ", s.slot, " of slot class ",
                                   s.slot_class, ", outside the arenas"));
        EXPERTD_ErrorDelete(ReleaseAndFree(handle.release()));  // `s` is gone from here on
        return bad;
      }
    }
    *lease = handle.release();
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_SessionPrefetch(EXPERTD_Session* session, uint32_t layer,
                                       const uint32_t* experts, size_t n) {
  if (auto* e = NotNull(__func__, {ARG(session)})) return e;
  if (n == 0) return nullptr;
  if (auto* e = NotNull(__func__, {ARG(experts)})) return e;
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    return FromStatus(
        session->state->session->Prefetch(layer, std::span<const uint32_t>(experts, n)));
  });
}

EXPERTD_Error* EXPERTD_SessionRelease(EXPERTD_Session* session, EXPERTD_Lease* lease) {
  return ReleaseOfSession(__func__, session, lease, /*wake=*/true);
}

EXPERTD_Error* EXPERTD_SessionReleaseLater(EXPERTD_Session* session, EXPERTD_Lease* lease) {
  return ReleaseOfSession(__func__, session, lease, /*wake=*/false);
}

EXPERTD_Error* EXPERTD_SessionFlush(EXPERTD_Session* session) {
  if (auto* e = NotNull(__func__, {ARG(session)})) return e;
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    std::lock_guard<std::mutex> lock(session->state->mu);
    if (session->state->session) session->state->session->Flush();
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_SessionWaitReady(EXPERTD_Session* session, EXPERTD_Lease* lease,
                                        void* cuda_stream) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(lease)})) return e;
  if (lease->state != session->state) {
    return Invalid(__func__, "the lease belongs to another session");
  }
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    return FromStatus(session->state->session->WaitReady(lease->lease, cuda_stream));
  });
}

EXPERTD_Error* EXPERTD_SessionWaitReadyOnHost(EXPERTD_Session* session, EXPERTD_Lease* lease) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(lease)})) return e;
  if (lease->state != session->state) {
    return Invalid(__func__, "the lease belongs to another session");
  }
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    return FromStatus(session->state->session->WaitReadyOnHost(lease->lease));
  });
}

EXPERTD_Error* EXPERTD_SessionRecordDone(EXPERTD_Session* session, EXPERTD_Lease* lease,
                                         void* cuda_stream) {
  if (auto* e = NotNull(__func__, {ARG(session), ARG(lease)})) return e;
  if (lease->state != session->state) {
    return Invalid(__func__, "the lease belongs to another session");
  }
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    return FromStatus(session->state->session->RecordDone(lease->lease, cuda_stream));
  });
}

EXPERTD_Error* EXPERTD_SessionPollErrors(EXPERTD_Session* session) {
  if (auto* e = NotNull(__func__, {ARG(session)})) return e;
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* {
    ec::Session& s = *session->state->session;
    const std::vector<v1::RequestError> errors = s.TakeAsyncErrors();
    const std::vector<uint64_t> expired = s.TakeExpiredLeases();
    if (errors.empty() && expired.empty()) return nullptr;
    std::string message;
    for (const v1::RequestError& e : errors) {
      absl::StrAppend(&message, message.empty() ? "" : "; ", "request ", e.seq(), ": ",
                      e.message());
    }
    for (uint64_t id : expired) {
      absl::StrAppend(&message, message.empty() ? "" : "; ", "lease ", id,
                      " outlived the lease TTL and was reclaimed");
    }
    const EXPERTD_Error_Code code =
        errors.empty() ? EXPERTD_ERROR_DEADLINE_EXCEEDED : ToCode(errors.front().code());
    return MakeError(code, message);
  });
}

// ---- Lease -------------------------------------------------------------------------------------

EXPERTD_Error* EXPERTD_LeaseInfo(EXPERTD_Lease* lease, uint64_t* id, uint32_t* layer,
                                 uint64_t* stall_us) {
  if (auto* e = NotNull(__func__, {ARG(lease)})) return e;
  if (id) *id = lease->lease.id;
  if (layer) *layer = lease->lease.layer;
  if (stall_us) *stall_us = static_cast<uint64_t>(absl::ToInt64Microseconds(lease->lease.stall));
  return nullptr;
}

EXPERTD_Error* EXPERTD_LeaseSlotCount(EXPERTD_Lease* lease, size_t* count) {
  if (auto* e = NotNull(__func__, {ARG(lease), ARG(count)})) return e;
  *count = lease->lease.slots.size();
  return nullptr;
}

EXPERTD_Error* EXPERTD_LeaseSlot(EXPERTD_Lease* lease, size_t i, uint32_t* expert,
                                 uint32_t* slot_class, uint32_t* slot, bool* hit) {
  if (auto* e = NotNull(__func__, {ARG(lease)})) return e;
  if (i >= lease->lease.slots.size()) {
    return Invalid(__func__, "slot index past the lease's slot count");
  }
  const ec::SlotView& s = lease->lease.slots[i];
  if (expert) *expert = s.expert;
  if (slot_class) *slot_class = s.slot_class;
  if (slot) *slot = s.slot;
  if (hit) *hit = s.hit;
  return nullptr;
}

EXPERTD_Error* EXPERTD_LeaseProjection(EXPERTD_Lease* lease, size_t i, uint32_t projection,
                                       const void** data, uint64_t* bytes) {
  if (auto* e = NotNull(__func__, {ARG(lease), ARG(data), ARG(bytes)})) return e;
  if (i >= lease->lease.slots.size()) {
    return Invalid(__func__, "slot index past the lease's slot count");
  }
  const ec::SlotView& s = lease->lease.slots[i];
  return Guard(__func__, [&](const char* fn) -> EXPERTD_Error* {
    if (EXPERTD_Error* e = CheckClass(fn, *lease->state, s.slot_class, projection)) return e;
    const ArenaView& v = lease->state->arenas[s.slot_class][projection];
    *data = v.base + uint64_t{s.slot} * v.stride;
    *bytes = v.stride;
    return nullptr;
  });
}

EXPERTD_Error* EXPERTD_LeaseDelete(EXPERTD_Lease* lease) {
  if (lease == nullptr) return nullptr;
  return Guard(__func__, [&](const char*) -> EXPERTD_Error* { return ReleaseAndFree(lease); });
}

}  // extern "C"
