#include "daemon.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "device/cuda_factory.h"
#include "device/device_probe.h"
#include "device/host/handle_passing.h"
#include "device/host/host_device.h"
#include "lane_server.h"
#include "lifecycle.h"
#include "metrics.h"
#include "served_model.h"
#include "service.h"
#include "sessions.h"
#include "shm_reclaim.h"
#include "synth/synth.h"
#include "unix_listener.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr uint64_t kDemoSeed = 7;

EngineOptions EngineOptionsFrom(const DaemonConfig& c) {
  EngineOptions eo;
  eo.slot_budget_bytes = c.device.slot_memory;
  eo.policy = std::string(NameOf(c.cache.policy));
  eo.predictor = std::string(NameOf(c.predictor.kind));
  eo.predictor_options.lookahead = c.predictor.lookahead;
  eo.predictor_options.max_experts = c.predictor.max_experts;
  eo.predictor_options.history_tokens = c.predictor.history_tokens;
  eo.staging_bytes = c.device.staging_memory;
  eo.readers.threads_per_group = c.readers.threads_per_group;
  eo.direct_copies = c.device.direct_copies;
  return eo;
}

PackSetOptions PackOptionsFrom(const DaemonConfig& c) {
  PackSetOptions po;
  switch (c.readers.method) {
    case ReadersConfig::Method::kPread: po.method = ReadMethod::kPread; break;
    case ReadersConfig::Method::kDirect: po.method = ReadMethod::kDirect; break;
    case ReadersConfig::Method::kMmap: po.method = ReadMethod::kMmap; break;
  }
  po.max_eio_retries = c.readers.max_eio_retries;
  return po;
}

LaneOptions LanesFrom(const DaemonConfig& config) {
  LaneOptions o;
  o.enabled = config.lane.enabled;
  o.spin = absl::Microseconds(config.lane.spin_us);
  o.client_hits = config.lane.client_hits;
  o.geometry.request_bytes = config.lane.request_ring_bytes;
  o.geometry.response_bytes = config.lane.response_ring_bytes;
  o.shm.shm_prefix = "expertd-lane";
  // A memfd passed to the session's process alone (the handle socket): no name another client
  // could open to write requests into someone else's lane.
  o.shm.backing = HostDeviceOptions::Backing::kMemfd;
  return o;
}

// One exchange on the handle socket: the request, the checks (SessionRegistry::Passed), the
// descriptors or a refusal. Short: a peer that sends nothing is dropped after 500 ms.
void ServeHandles(SessionRegistry& sessions, int conn, const Peer& peer) {
  absl::StatusOr<std::string> id = ReadHandleRequest(conn, absl::Milliseconds(500));
  if (!id.ok()) {
    spdlog::warn("handle socket: pid {} uid {}: {}", peer.pid, peer.uid,
                 std::string(id.status().message()));
    (void)SendRefusal(conn, id.status());
    ::close(conn);
    return;
  }
  absl::StatusOr<std::pair<std::shared_ptr<Session>, std::vector<int>>> passed =
      sessions.Passed(*id, peer);
  absl::Status sent = passed.ok() ? SendDescriptors(conn, passed->second)
                                  : SendRefusal(conn, passed.status());
  if (!passed.ok()) {
    spdlog::warn("handle socket: pid {} uid {} refused: {}", peer.pid, peer.uid,
                 std::string(passed.status().message()));
  } else if (!sent.ok()) {
    spdlog::warn("handle socket: pid {}: {}", peer.pid, std::string(sent.message()));
  }
  ::close(conn);
}

SessionLimits LimitsFrom(const LimitsConfig& l) {
  SessionLimits s;
  s.max_sessions = l.max_sessions;
  s.max_leases_per_session = l.max_leases_per_session;
  s.max_experts_per_acquire = l.max_experts_per_acquire;
  s.max_slots_per_session = l.max_slots_per_session;
  s.lease_ttl = absl::FromChrono(l.lease_ttl);
  s.attach_timeout = absl::FromChrono(l.session_attach_timeout);
  s.max_message_bytes = l.max_message_bytes;
  return s;
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("listen.tcp_token_file: cannot read ", path));
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen.tcp_token_file: ", path, ": the token (first line) must be at least 16 bytes"));
  }
  return token;
}

// Everything the daemon owns, declared in construction order; destroyed in reverse.
struct Daemon {
  std::vector<std::unique_ptr<Device>> devices;  // the default first
  // The residency tables of models on devices whose arenas are not host memory (CUDA), for
  // client-side hits; nullptr when every device's arenas are host memory or lane.client_hits
  // is off.
  std::unique_ptr<Device> table_device;
  std::vector<std::unique_ptr<ServedModel>> models;
  std::unique_ptr<SessionRegistry> sessions;
  PeerTable peers;
  ServiceState state;
  std::unique_ptr<ExpertdService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<UnixListener> unix_listener;
  std::unique_ptr<UnixListener> handle_listener;  // the handle socket (docs/protocol.md)
  std::unique_ptr<MetricsServer> metrics;
  // What the watchdog reports: false once the daemon cannot serve any more (a sticky device
  // error), so the service manager restarts it. Draining is still healthy.
  std::atomic<bool> healthy{true};

  void SetHealth(bool serving) {
    if (!server) return;
    grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
    if (health == nullptr) return;
    health->SetServingStatus("", serving);
    // A model serves while every pack of each of its instances (one per device) does.
    std::map<std::string, bool> by_name;
    for (const auto& m : models) {
      auto [it, fresh] = by_name.emplace(m->name(), true);
      it->second = it->second && m->PackHealth().ok();
    }
    for (const auto& [name, packs_ok] : by_name) {
      health->SetServingStatus(name, serving && packs_ok);
    }
  }

  // Packs whose files changed under the daemon: logged once each, and the model's health turns
  // NOT_SERVING.
  void CheckPacks() {
    bool changed = false;
    for (const auto& m : models) {
      for (const std::string& why : m->CheckPacks()) {
        spdlog::error("model {} on {}: {}; acquires that need it fail, health NOT_SERVING",
                      m->name(), m->device_name(), why);
        changed = true;
      }
    }
    if (changed) SetHealth(state.serving);
  }

  // Stops serving in a fixed order: listeners, then the gRPC server (its Session streams end,
  // which ends their sessions), then sessions (leases go back to the engines), then the devices'
  // copy engines, the models and finally the devices.
  void TearDown() {
    metrics.reset();
    if (unix_listener) unix_listener->Stop();
    if (handle_listener) handle_listener->Stop();
    if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    unix_listener.reset();
    handle_listener.reset();
    server.reset();
    sessions.reset();
    // Devices stop before the engines: a copy still held for a done record that will not come
    // now is cancelled, so every fill settles and the engines' destructors do not wait forever.
    for (const auto& device : devices) device->Shutdown();
    models.clear();
    devices.clear();
    table_device.reset();
  }
};

// The devices to serve from, the default first: one CUDA device per configured ordinal when
// device.kind asks for CUDA (or is auto and a GPU is usable), else the host device. With auto,
// a CUDA device that cannot start leaves the daemon on the host device, saying why in one line.
// Devices whose fence objects are bounded (CUDA: IPC events, a few thousand per process): after
// a model's tables were made, how many of its sessions fit. None is an error at start-up — the
// model could be loaded but never used; fewer than limits.max_sessions is logged.
absl::Status CheckFenceRoom(const std::string& model, const Device& device, uint32_t slots,
                            const DaemonConfig& config) {
  const uint32_t limit = device.caps().max_fence_objects;
  if (limit == 0 || slots == 0) return absl::OkStatus();
  const uint32_t used = std::min(device.fence_objects_in_use(), limit);
  const uint32_t room = (limit - used) / slots;
  const std::string what = absl::StrCat(
      "model ", model, " on ", AV(device.name()), ": its fence tables hold ", used, " of the ",
      limit, " IPC events this process may have (two per slot), and each session takes ", slots,
      " more (one per slot)");
  if (room == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": not one session would fit. Lower device.slot_memory (fewer slots) until "
        "3 x slots is at most ", limit, " (docs/device.md, \"IPC event limit\")"));
  }
  if (room < config.limits.max_sessions) {
    spdlog::warn("{}: room for {} session(s) at once, fewer than limits.max_sessions = {}; more "
                 "are refused (RESOURCE_EXHAUSTED) until one ends",
                 what, room, config.limits.max_sessions);
  } else {
    spdlog::info("{}: room for {} session(s)", what, room);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<Device>>> MakeDevices(const DaemonConfig& config,
                                                                 const DeviceProbe& probe) {
  std::vector<std::unique_ptr<Device>> devices;
  const DeviceConfig& dc = config.device;
  const bool asked = dc.kind == DeviceConfig::Kind::kCuda;
  if (asked && probe.kind != DeviceProbe::Kind::kCuda) {
    return absl::FailedPreconditionError(
        GetBuildFeatures().cuda_backend
            ? "device.kind = cuda, but no usable CUDA GPU was found (see the line above)"
            : "device.kind = cuda, but this build has no CUDA backend (built without the toolkit)");
  }
  if (dc.kind != DeviceConfig::Kind::kHost && probe.kind == DeviceProbe::Kind::kCuda) {
    absl::Status failed;
    for (int ordinal : dc.cuda_devices) {
      CudaDeviceOptions co;
      co.ordinal = ordinal;
      co.copy_streams = std::min<uint32_t>(dc.copy_streams, 16);
      co.max_ipc_events = dc.cuda_ipc_event_limit;
      if (const char* c = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS")) co.max_connections = c;
      // A done record pending as long as a lease may be held idle is given up on.
      co.done_record_timeout = absl::FromChrono(config.limits.lease_ttl);
      absl::StatusOr<std::unique_ptr<Device>> device = MakeCudaDeviceIfBuilt(co);
      if (!device.ok()) {
        failed = absl::Status(device.status().code(),
                              absl::StrCat("device.cuda_devices: GPU ", ordinal, ": ",
                                           device.status().message()));
        break;
      }
      devices.push_back(*std::move(device));
    }
    if (failed.ok()) return devices;
    if (asked) return failed;
    devices.clear();
    spdlog::warn("device: {}; device.kind = auto serves from the host device instead",
                 std::string(failed.message()));
  }
  HostDeviceOptions ho;
  ho.copy_threads = dc.copy_streams;
  // Arenas and fence tables are memfds passed to each session's process (the handle socket):
  // nothing in /dev/shm, so a daemon that dies leaves nothing to clean; the memory goes with
  // the last process that maps it.
  ho.backing = HostDeviceOptions::Backing::kMemfd;
  ho.shm_prefix = "expertd";  // memfd names, shown in /proc/PID/maps as "/memfd:expertd:LABEL"
  absl::StatusOr<std::unique_ptr<Device>> device = MakeHostDevice(ho);
  if (!device.ok()) return device.status();
  devices.push_back(*std::move(device));
  return devices;
}

}  // namespace

absl::StatusOr<std::string> PrepareDemoModel(const std::string& cache_dir,
                                             const std::string& preset) {
  namespace fs = std::filesystem;
  const fs::path dir(cache_dir);
  const fs::path model = dir / "model.gguf";
  const fs::path marker = dir / "demo-model.txt";
  const std::string want = absl::StrCat(preset, " seed ", kDemoSeed);
  {
    std::ifstream in(marker);
    std::string have;
    if (in && std::getline(in, have) && have == want && fs::exists(model)) return model.string();
  }
  spdlog::info("demo: synthesizing a {} model into {}", preset, cache_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("demo.cache_dir ", cache_dir, ": ", ec.message()));
  // Built next to the final place and renamed, so an interrupted run never leaves a half model.
  const fs::path tmp = dir / absl::StrCat(".synth-", getpid());
  fs::remove_all(tmp, ec);
  SynthOptions so;
  so.preset = preset;
  so.out_dir = tmp.string();
  so.seed = kDemoSeed;
  absl::StatusOr<std::vector<std::string>> written = SynthesizeModel(so);
  if (!written.ok()) return written.status();
  fs::rename(tmp / "model.gguf", model, ec);
  fs::remove_all(tmp);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("demo: rename into ", cache_dir, ": ", ec.message()));
  std::ofstream(marker) << want << '\n';
  return model.string();
}

int RunDaemon(DaemonConfig config, const DaemonFlags& flags, const Environment& env) {
  Daemon d;
  ServiceManager manager;  // after d: its watchdog thread reads d.healthy until it is joined
  const auto fail = [&](const absl::Status& st) {
    spdlog::error("start-up failed: {}", std::string(st.message()));
    manager.Status(absl::StrCat("failed: ", st.message()));
    d.TearDown();
    return 1;
  };
  manager.Status("starting");
  spdlog::info("config: {}", DescribeConfig(config));

  std::vector<ModelSpec> specs;
  if (flags.demo) {
    absl::StatusOr<std::string> dir = ResolveDemoCacheDir(config.demo, env);
    if (!dir.ok()) return fail(dir.status());
    absl::StatusOr<std::string> gguf = PrepareDemoModel(*dir, config.demo.preset);
    if (!gguf.ok()) return fail(gguf.status());
    specs.push_back({"demo", *gguf, "", "", {}});
    // A quarter of the model's bytes, unless configured: the cache then has to work.
    if (config.device.slot_memory == DefaultConfig().device.slot_memory) {
      config.device.slot_memory = std::max<uint64_t>(std::filesystem::file_size(*gguf) / 4, 1);
    }
  }
  for (const ModelConfig& m : config.models) {
    ModelSpec s{m.name, m.gguf, m.index, m.v1_q_pack, {}};
    for (const SourceGroupConfig& g : m.source_groups) s.source_groups[g.name] = g.packs;
    specs.push_back(std::move(s));
  }
  if (specs.empty()) return fail(RequireModels(config));

  // What killed daemons left in /dev/shm (their arenas are most of the memory they used).
  if (const ReclaimedShm r = ReclaimStaleSharedMemory("/dev/shm", getpid()); !r.names.empty()) {
    spdlog::warn("removed {} shared-memory object(s), {} bytes, left by dead expertd process(es) "
                 "{}", r.names.size(), r.bytes, absl::StrJoin(r.pids, ", "));
  }
  const DeviceProbe probe = ProbeDevices();
  spdlog::info("{}", probe.log_line);
  absl::StatusOr<std::vector<std::unique_ptr<Device>>> devices = MakeDevices(config, probe);
  if (!devices.ok()) return fail(devices.status());
  d.devices = *std::move(devices);
  for (const auto& device : d.devices) {
    d.state.device_names.emplace_back(device->name());
    const Capabilities& c = device->caps();
    const std::string notes = device->notes();
    spdlog::info("serving from device {} ({} copy engine(s), {}pinned staging, arenas up to {} "
                 "bytes{}{})",
                 device->name(), c.copy_engines, c.staging_pinned ? "" : "un",
                 c.max_arena_bytes, notes.empty() ? "" : "; ", notes);
  }

  d.sessions = std::make_unique<SessionRegistry>(LimitsFrom(config.limits), LanesFrom(config));
  d.state.sessions = d.sessions.get();
  d.state.peers = &d.peers;
  d.service = std::make_unique<ExpertdService>(&d.state);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.RegisterService(d.service.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.limits.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(config.limits.max_message_bytes));
  int tcp_port = 0;
  std::string tcp_addr;
  if (config.listen.tcp.has_value()) {
    if (!config.listen.tcp_token_file.empty()) {
      absl::StatusOr<std::string> token = ReadToken(config.listen.tcp_token_file);
      if (!token.ok()) return fail(token.status());
      d.state.tcp_token = *token;
    }
    tcp_addr = FormatHostPort(*config.listen.tcp);
    builder.AddListeningPort(tcp_addr, grpc::InsecureServerCredentials(), &tcp_port);
  }
  d.server = builder.BuildAndStart();
  if (!d.server) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("the gRPC server did not start (listen.tcp = '", tcp_addr, "' in use?)")));
  }
  if (config.listen.tcp.has_value() && tcp_port == 0) {
    return fail(absl::FailedPreconditionError(absl::StrCat("listen.tcp: cannot bind ", tcp_addr)));
  }
  d.SetHealth(false);

  UnixListenerOptions uo;
  uo.path = ResolveSocketPath(config.listen, env);
  uo.socket_mode = config.listen.socket_mode;
  uo.directory_mode = config.listen.directory_mode;
  uo.allowed_uids = config.listen.allowed_uids;
  uo.allowed_gids = config.listen.allowed_gids;
  absl::StatusOr<std::unique_ptr<UnixListener>> listener = UnixListener::Bind(uo, &d.peers);
  if (!listener.ok()) return fail(listener.status());
  d.unix_listener = *std::move(listener);
  // The handle socket beside it, with the same gates: where a session's client receives the
  // descriptors of its memfd objects.
  uo.path = d.unix_listener->path() + ".handles";
  absl::StatusOr<std::unique_ptr<UnixListener>> handles = UnixListener::Bind(uo, nullptr);
  if (!handles.ok()) return fail(handles.status());
  d.handle_listener = *std::move(handles);
  d.state.handle_socket = d.handle_listener->path();
  d.handle_listener->Start([&d](int conn, const Peer& peer) { ServeHandles(*d.sessions, conn, peer); });
  d.unix_listener->Start(d.server.get());
  spdlog::info("listening on unix:{}{}", d.unix_listener->path(),
               tcp_port > 0 ? absl::StrCat(" and tcp ", config.listen.tcp->host, ":", tcp_port,
                                           d.state.tcp_token.empty() ? " (no token)" : " (token)")
                            : std::string());
  if (config.metrics.listen.has_value()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> m = MetricsServer::Start(
        config.metrics.listen->host, config.metrics.listen->port, &d.state);
    if (!m.ok()) return fail(m.status());
    d.metrics = *std::move(m);
    spdlog::info("metrics on http://{}:{}/metrics", config.metrics.listen->host, d.metrics->port());
  }
  if (flags.hold_before_serving > absl::ZeroDuration()) {
    manager.Status(absl::StrCat("holding for ", absl::FormatDuration(flags.hold_before_serving),
                                " before loading models"));
    absl::SleepFor(flags.hold_before_serving);
  }

  EngineOptions engine_options = EngineOptionsFrom(config);
  const bool tables_elsewhere = std::any_of(
      d.devices.begin(), d.devices.end(),
      [](const auto& dev) { return !dev->caps().arenas_host_writable; });
  if (config.lane.enabled && config.lane.client_hits && tables_elsewhere) {
    // Residency tables are read by clients' CPUs: shared host memory, passed like the lanes.
    HostDeviceOptions to;
    to.copy_threads = 1;  // it never copies
    to.backing = HostDeviceOptions::Backing::kMemfd;
    to.shm_prefix = "expertd-tables";
    absl::StatusOr<std::unique_ptr<Device>> tables = MakeHostDevice(to);
    if (!tables.ok()) return fail(tables.status());
    d.table_device = *std::move(tables);
    engine_options.table_device = d.table_device.get();
  }
  const PackSetOptions pack_options = PackOptionsFrom(config);
  for (const ModelSpec& spec : specs) {
    for (const auto& device : d.devices) {
      manager.Status(absl::StrCat("loading model ", spec.name, " from ", spec.gguf, " on ",
                                  AV(device->name())));
      absl::StatusOr<std::unique_ptr<ServedModel>> m =
          ServedModel::Load(spec, *device, pack_options, engine_options);
      if (!m.ok()) return fail(m.status());
      const ModelCatalog& c = (*m)->catalog();
      uint32_t slots = 0;
      for (const SlotClass& sc : c.slot_classes()) slots += (*m)->engine().slots(sc.id);
      spdlog::info("model {} on {}: {} MoE layers x {} experts (top-{}), {} packs verified, {} "
                   "slots in {} class(es)",
                   spec.name, device->name(), c.layers().size(), c.n_expert(), c.n_expert_used(),
                   c.packs().size(), slots, c.slot_classes().size());
      for (const PackCopyPath& p : (*m)->engine().CopyPaths()) {
        spdlog::info("model {} on {}: pack {}: {}", spec.name, device->name(), p.pack, p.detail);
      }
      if (absl::Status room = CheckFenceRoom(spec.name, *device, slots, config); !room.ok()) {
        return fail(room);
      }
      d.models.push_back(*std::move(m));
    }
  }
  {
    std::lock_guard<std::mutex> lock(d.state.models_mu);
    for (const auto& m : d.models) d.state.models[m->name()].push_back(m.get());
  }
  d.state.serving = true;
  d.SetHealth(true);
  std::vector<std::string> names;
  for (const auto& [name, on] : d.state.models) names.push_back(name);
  manager.Ready(absl::StrCat("serving ", absl::StrJoin(names, ", "), " on unix:",
                             d.unix_listener->path()));
  manager.StartWatchdog(&d.healthy);

  DaemonConfig live = config;
  absl::Status device_health;
  std::string failed_device;
  for (;;) {
    const int sig = WaitForSignal(absl::Milliseconds(500));
    for (const auto& device : d.devices) {
      device_health = device->Health();
      if (!device_health.ok()) {
        failed_device = std::string(device->name());
        break;
      }
    }
    if (!device_health.ok()) break;
    d.CheckPacks();
    if (sig == 0) continue;
    if (sig == SIGHUP) {
      manager.Reloading();
      bool reopened = false;
      for (const auto& m : d.models) {
        for (const std::string& line : m->ReopenPacks()) {
          spdlog::info("SIGHUP: model {} on {}: {}", m->name(), m->device_name(), line);
          reopened = true;
        }
      }
      if (reopened) d.SetHealth(d.state.serving);
      if (flags.config_path.empty()) {
        spdlog::info("SIGHUP: no config file to reload");
      } else {
        absl::StatusOr<DaemonConfig> fresh = LoadConfig(flags.config_path);
        if (!fresh.ok()) {
          spdlog::error("SIGHUP: {} not reloaded: {}", flags.config_path, std::string(fresh.status().message()));
        } else {
          if (!flags.socket_override.empty()) fresh->listen.unix_socket = flags.socket_override;
          if (flags.log_level_override) fresh->logging.level = *flags.log_level_override;
          absl::Status st = ApplyReloadable(*fresh, live);
          SetLogLevel(live.logging.level);
          spdlog::info("SIGHUP: logging.level = {}", NameOf(live.logging.level));
          if (!st.ok()) spdlog::warn("SIGHUP: {}", std::string(st.message()));
          const EngineOptions next = EngineOptionsFrom(live);
          for (const auto& m : d.models) {
            absl::Status r = m->engine().Reconfigure(next.policy, next.predictor,
                                                     next.predictor_options);
            if (r.ok()) {
              spdlog::info("SIGHUP: model {} on {}: cache.policy = {}, predictor = {} (lookahead "
                           "{}, max_experts {}, history_tokens {})",
                           m->name(), m->device_name(), next.policy, next.predictor, live.predictor.lookahead,
                           live.predictor.max_experts, live.predictor.history_tokens);
            } else {
              spdlog::error("SIGHUP: model {}: {}", m->name(), std::string(r.message()));
            }
          }
        }
      }
      manager.ReloadDone();
      continue;
    }
    spdlog::info("signal {}: stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    break;
  }
  if (!device_health.ok()) {
    // A sticky device error: nothing on this device can be served again. Stop at once and exit
    // non-zero so the service manager restarts the daemon with a fresh context.
    d.healthy = false;
    d.state.serving = false;
    d.SetHealth(false);
    spdlog::critical("device {} failed: {}; exiting for a restart", failed_device,
                     std::string(device_health.message()));
    manager.Stopping(absl::StrCat("device failed: ", device_health.message()));
    d.sessions->BeginDrain();
    d.TearDown();
    return 3;
  }

  d.state.serving = false;
  d.SetHealth(false);
  d.sessions->BeginDrain();
  const uint64_t outstanding = d.sessions->LeasesOutstanding();
  manager.Stopping(absl::StrCat("draining ", outstanding, " leases (up to ",
                                FormatDuration(config.limits.drain_timeout), ")"));
  const bool drained = d.sessions->WaitDrained(absl::FromChrono(config.limits.drain_timeout));
  if (drained) {
    spdlog::info("drained: no leases outstanding");
  } else {
    spdlog::warn("drain timeout: {} leases still held are reclaimed",
                 d.sessions->LeasesOutstanding());
  }
  d.TearDown();
  spdlog::info("stopped");
  return 0;
}

}  // namespace expertd
