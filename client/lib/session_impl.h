// A session of the client library (internal to client/lib): the stream and, where the daemon
// gave one, the request lane that carry its acquires and releases, its fences or CUDA events,
// and its client-side hits (local_hits.h). client.cpp opens the session's shared objects and
// starts it here.
#pragma once

#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "client.h"
#include "client_handles.h"
#include "expertd/v1/service.pb.h"

namespace expertd::client::internal {

// Attaches the session `info` names over `channel`, with the slot classes and lane this process
// mapped for it, and starts reading its answers. `client_hits`: serve acquires of resident
// experts from the residency table where the session allows it (SessionOptions::client_hits).
absl::StatusOr<std::unique_ptr<Session>> StartSession(std::shared_ptr<grpc::Channel> channel,
                                                      v1::OpenSessionResponse info,
                                                      std::vector<SlotClassView> classes,
                                                      std::unique_ptr<ClientLane> lane,
                                                      int cuda_device, bool client_hits);

}  // namespace expertd::client::internal
