// The gRPC service (proto/expertd/v1/service.proto) over the served models and the session
// registry. Unary calls answer inline from in-memory state; the Session stream is a reactor that
// never blocks: acquires go to the engine and their grants come back on engine threads through
// the stream's write queue. docs/protocol.md describes the protocol.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "expertd/v1/service.grpc.pb.h"
#include "served_model.h"
#include "sessions.h"

namespace expertd {

// Peer credentials of accepted Unix connections, keyed by the descriptor handed to gRPC (the
// call's peer string is "fd:N" for such connections). Thread-safe.
class PeerTable {
 public:
  void Put(int fd, const Peer& peer);
  // The peer of a call: a Unix connection from the table, or a TCP peer (unix_socket false).
  // nullopt for a peer string that is neither (the call is refused).
  std::optional<Peer> Lookup(const std::string& grpc_peer) const;

 private:
  mutable std::mutex mu_;
  std::map<int, Peer> by_fd_;
};

// What the service reads; owned by the daemon, which outlives the service.
struct ServiceState {
  // Filled once before serving starts: per model name, one ServedModel per device (its own
  // slot pools), the default device's first.
  std::map<std::string, std::vector<ServedModel*>> models;
  std::atomic<bool> serving{false};            // models loaded; false again while draining
  SessionRegistry* sessions = nullptr;
  const PeerTable* peers = nullptr;
  std::vector<std::string> device_names;  // every device served, the default first
  std::string tcp_token;  // "" = TCP needs no token (allowed only on loopback by the config)
  std::string handle_socket;  // where clients fetch passed descriptors (docs/protocol.md)
  absl::Time started_at = absl::Now();
  std::mutex models_mu;  // guards `models` while it is filled
};

class ExpertdService final : public v1::Expertd::CallbackService {
 public:
  explicit ExpertdService(ServiceState* state) : state_(state) {}

  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* OpenSession(grpc::CallbackServerContext* context,
                                        const v1::OpenSessionRequest* request,
                                        v1::OpenSessionResponse* response) override;
  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;

 private:
  // The caller's identity, or the status refusing the call (unknown transport; TCP without the
  // bearer token).
  absl::StatusOr<Peer> Authenticate(grpc::CallbackServerContext* context) const;
  // The model on `device` ("" = its default device); nullptr with `error` set when absent.
  ServedModel* FindModel(const std::string& name, const std::string& device, absl::Status* error);

  ServiceState* const state_;
};

grpc::Status ToGrpc(const absl::Status& status);

}  // namespace expertd
