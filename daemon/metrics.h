// Prometheus text exposition of the daemon's counters on an optional HTTP listener
// ([metrics] listen). Names follow Prometheus conventions: base units (seconds, bytes), `_total`
// for counters. Unauthenticated by design: bind it to loopback or a management network.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "service.h"

namespace httplib {
class Server;
}

namespace expertd {

// The exposition text (version 0.0.4) for the current state.
std::string RenderMetrics(ServiceState& state);

class MetricsServer {
 public:
  // Binds host:port (port 0 picks one) and serves GET /metrics on a thread of its own.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host, int port,
                                                              ServiceState* state);
  ~MetricsServer();
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace expertd
