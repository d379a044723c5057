// The client and its OpenSession: connects, opens a session, and maps what the daemon sends for
// it (arenas, fences or CUDA events, residency tables, the request lane) before the session
// starts (session.cpp).
#include "client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "device/cuda_factory.h"
#include "device/host/handle_passing.h"
#include "device/host/host_device.h"
#include "expertd/v1/service.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "client_handles.h"
#include "session_impl.h"
#include "util/process.h"

namespace expertd::client {
namespace {

using internal::ArenaCache;
using internal::ClientLane;
using internal::FromGrpc;
using internal::MapLane;
using internal::SlotClassView;
using internal::ToArenaExport;
using internal::StartSession;
using internal::ToFenceExport;

class ClientImpl final : public Client {
 public:
  ClientImpl(std::shared_ptr<grpc::Channel> channel, std::string token)
      : channel_(std::move(channel)), token_(std::move(token)),
        stub_(v1::Expertd::NewStub(channel_)) {}

  void Prepare(grpc::ClientContext& ctx, absl::Duration timeout = absl::Seconds(10)) const {
    if (!token_.empty()) ctx.AddMetadata("authorization", "Bearer " + token_);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }

  absl::StatusOr<std::vector<v1::ModelInfo>> ListModels() override {
    grpc::ClientContext ctx;
    Prepare(ctx);
    v1::ListModelsResponse resp;
    absl::Status st = FromGrpc(stub_->ListModels(&ctx, {}, &resp), "ListModels");
    if (!st.ok()) return st;
    return std::vector<v1::ModelInfo>(resp.models().begin(), resp.models().end());
  }

  absl::StatusOr<v1::GetStatsResponse> GetStats(const std::string& model) override {
    grpc::ClientContext ctx;
    Prepare(ctx);
    v1::GetStatsRequest req;
    req.set_model(model);
    v1::GetStatsResponse resp;
    absl::Status st = FromGrpc(stub_->GetStats(&ctx, req, &resp), "GetStats");
    if (!st.ok()) return st;
    return resp;
  }

  absl::StatusOr<bool> Health(const std::string& service) override {
    auto stub = grpc::health::v1::Health::NewStub(channel_);
    grpc::ClientContext ctx;
    Prepare(ctx, absl::Seconds(5));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    absl::Status st = FromGrpc(stub->Check(&ctx, req, &resp), "Health.Check");
    if (!st.ok()) return st;
    return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  }

  absl::StatusOr<std::unique_ptr<Session>> OpenSession(const SessionOptions& options) override {
    grpc::ClientContext ctx;
    Prepare(ctx);
    v1::OpenSessionRequest req;
    req.set_model(options.model);
    req.set_device(options.device);
    req.set_client_pid(CurrentProcessId());
    req.set_client_name(options.client_name);
    req.set_transport(options.transport == SessionOptions::Transport::kLane     ? v1::TRANSPORT_LANE
                      : options.transport == SessionOptions::Transport::kStream ? v1::TRANSPORT_STREAM
                                                                                 : v1::TRANSPORT_AUTO);
    v1::OpenSessionResponse resp;
    absl::Status st = FromGrpc(stub_->OpenSession(&ctx, req, &resp), "OpenSession");
    if (!st.ok()) return st;
    const bool cuda = resp.device_kind() == "cuda";
    if (!cuda && resp.device_kind() != "host") {
      return absl::UnimplementedError(absl::StrCat("the daemon serves ", resp.device(), " ('",
                                                   resp.device_kind(),
                                                   "'); this client knows host and cuda"));
    }
    int ordinal = options.cuda_device;
    if (cuda && !resp.device_uuid().empty()) {
      // The daemon's GPU by its UUID: this process may see the GPUs in another order.
      absl::StatusOr<int> resolved = ResolveCudaDeviceIfBuilt(resp.device_uuid(), ordinal);
      if (!resolved.ok()) {
        return absl::Status(resolved.status().code(),
                            absl::StrCat("the daemon serves ", resp.device(), ": ",
                                         resolved.status().message()));
      }
      ordinal = *resolved;
    } else if (cuda && ordinal < 0) {
      // A daemon that sends no UUID: its ordinal, which is this process's only when both see
      // the same CUDA_VISIBLE_DEVICES.
      const std::string& name = resp.device();
      if (name.rfind("cuda:", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &ordinal)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cannot tell this process's ordinal of the daemon's device '", name,
            "'; set SessionOptions::cuda_device"));
      }
    }
    // Objects without a name (memfds) come as descriptors over the handle socket; they are
    // closed once mapped (the mappings stay).
    PassedDescriptors passed;
    if (!resp.handle_socket().empty()) {
      absl::StatusOr<PassedDescriptors> fetched =
          FetchDescriptors(resp.handle_socket(), resp.session_id(), absl::Seconds(10));
      if (!fetched.ok()) return fetched.status();
      passed = *std::move(fetched);
    }
    std::vector<SlotClassView> classes;
    uint64_t pin_base = 0;
    for (const v1::SlotClassHandles& h : resp.slot_classes()) {
      SlotClassView c;
      for (const v1::ArenaHandle& a : h.arenas()) {
        if (cuda) {
          absl::StatusOr<std::shared_ptr<const CudaArenaView>> v =
              OpenCudaArenaIfBuilt(ToArenaExport(a, passed), ordinal);
          if (!v.ok()) return v.status();
          c.cuda_arenas.push_back(*std::move(v));
        } else {
          absl::StatusOr<std::shared_ptr<MappedArena>> m = ArenaCache::Get().Map(a, passed);
          if (!m.ok()) return m.status();
          c.arenas.push_back(*std::move(m));
        }
        c.strides.push_back(a.slot_stride());
      }
      if (h.has_residency() &&
          static_cast<int>(classes.size()) < resp.model().slot_classes_size()) {
        absl::StatusOr<std::shared_ptr<MappedArena>> m = ArenaCache::Get().Map(h.residency(), passed);
        if (!m.ok()) return m.status();
        c.residency = *std::move(m);
        const v1::SlotClass& sc = resp.model().slot_classes(static_cast<int>(classes.size()));
        c.layers.assign(sc.layers().begin(), sc.layers().end());
        c.pin_base = pin_base;
        const uint64_t table_bytes = h.residency().bytes();
        const uint64_t slot_bytes = uint64_t{16} * h.slots();
        const uint64_t hint_bytes = uint64_t{4} * c.layers.size();
        if (c.layers.empty() || table_bytes < slot_bytes ||
            (table_bytes - slot_bytes) % hint_bytes != 0 ||
            table_bytes > c.residency->data().size()) {
          return absl::InternalError(absl::StrCat("slot class ", h.slot_class(),
                                                  ": the residency table's size does not add up"));
        }
        c.n_expert = static_cast<uint32_t>((table_bytes - slot_bytes) / hint_bytes);
      }
      pin_base += h.slots();
      if (cuda) {
        absl::StatusOr<std::shared_ptr<CudaSessionEvents>> e =
            OpenCudaEventsIfBuilt(ToFenceExport(h.fences(), passed), ordinal);
        if (!e.ok()) return e.status();
        c.events = *std::move(e);
      } else {
        absl::StatusOr<MappedFences> f = MapFences(ToFenceExport(h.fences(), passed));
        if (!f.ok()) return f.status();
        c.fences = std::make_unique<MappedFences>(*std::move(f));
      }
      classes.push_back(std::move(c));
    }
    std::unique_ptr<ClientLane> lane;
    if (resp.has_lane()) {
      absl::StatusOr<std::unique_ptr<ClientLane>> mapped = MapLane(resp.lane(), passed);
      if (!mapped.ok()) return mapped.status();
      lane = *std::move(mapped);
    }
    return StartSession(channel_, std::move(resp), std::move(classes), std::move(lane),
                        cuda ? ordinal : -1, options.client_hits);
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  const std::string token_;
  std::unique_ptr<v1::Expertd::Stub> stub_;
};

}  // namespace

std::string ChannelTarget(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return address;
  if (!address.empty() && address[0] == '/') return "unix://" + address;
  return address;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ConnectOptions& options) {
  if (options.address.empty()) return absl::InvalidArgumentError("no daemon address given");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      ChannelTarget(options.address), grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", options.address,
                                               " (is expertd running, and may this user connect?)"));
  }
  return std::unique_ptr<Client>(new ClientImpl(std::move(channel), options.token));
}

}  // namespace expertd::client
