// The daemon's configuration: one typed struct, parsed once from a TOML file in main, adjusted by
// command-line flags, validated, then passed down by const reference. configs/expertd.toml lists
// every key with its default and unit; the defaults below must stay equal to it (config_test
// parses that file and compares it with DefaultConfig()).
//
// Rules (STYLE.md §4, DESIGN.md §7):
//   - a missing key takes its documented default;
//   - a present but invalid key, an unknown key or an unknown table stops start-up with an
//     InvalidArgument status naming FILE:LINE:COL and the full dotted key ("device.kind: expected
//     one of auto, host, cuda, got \"gpu\""); every problem of a file is reported, one per line;
//   - nothing here throws, reads the environment behind the caller's back, or touches files other
//     than the config file itself (pack and token files are opened by the daemon at start-up).
//
// Thread-safety: plain values; the functions are pure and reentrant.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace expertd {

// The process environment, captured once in main so config resolution stays testable.
struct Environment {
  std::map<std::string, std::string, std::less<>> vars;

  // The value of `name`, or "" when it is unset.
  std::string Get(std::string_view name) const;
  // Every variable of the running process. The only place config code reads the environment.
  static Environment FromProcess();
};

// "HOST:PORT" or "[IPV6]:PORT". `host` is kept without brackets; port is 0..65535, where 0 asks
// the kernel for a free port (the daemon logs the one it got; meant for tests).
struct HostPort {
  std::string host;
  uint16_t port = 0;
  bool operator==(const HostPort&) const = default;
};
absl::StatusOr<HostPort> ParseHostPort(std::string_view text);
std::string FormatHostPort(const HostPort& hp);  // brackets an IPv6 host again
// True for the hosts an unauthenticated TCP listener may bind: 127.0.0.1, ::1, localhost.
bool IsLoopbackHost(std::string_view host);

// Sizes: a non-negative TOML integer (bytes) or a string "<digits><unit>" with unit B, KiB, MiB,
// GiB or TiB (binary, case-sensitive; one optional space). Decimal units ("1G", "1GB") are
// refused because they are ambiguous. Overflow is an error.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);
std::string FormatByteSize(uint64_t bytes);  // largest unit that divides exactly: "64MiB"
// Durations: a string "<digits><unit>" with unit ms, s, m or h ("250ms", "30s", "2m", "1h").
absl::StatusOr<std::chrono::milliseconds> ParseDurationText(std::string_view text);
std::string FormatDuration(std::chrono::milliseconds d);  // "60s", "250ms"

// [listen]: where clients connect. The Unix socket is always served; TCP only when `tcp` is set.
struct ListenConfig {
  // Socket path; "" = DefaultSocketPath(env) at start-up. At most 107 bytes (sun_path).
  std::string unix_socket;
  // File mode of the socket and of the folder the daemon creates for it (when systemd has not
  // created it: RuntimeDirectoryMode= then wins). Connecting needs write permission on the socket,
  // so the socket's group is the first gate; SO_PEERCRED below is the second.
  uint32_t socket_mode = 0660;
  uint32_t directory_mode = 0750;  // must include 0700: the daemon creates/removes its socket
  // Peer check on every accepted Unix connection (SO_PEERCRED): the daemon's own uid is always
  // accepted; otherwise the peer's uid must be in allowed_uids, or its primary gid or one of its
  // supplementary groups in allowed_gids. Both empty = own uid only.
  std::vector<uint32_t> allowed_uids;
  std::vector<uint32_t> allowed_gids;
  // TCP listener; nullopt = none. Requires tcp_token_file (a file whose first line, at least 16
  // bytes, is the bearer token clients must send), or tcp_allow_unauthenticated = true on a
  // loopback host. The token file is read by the daemon at start-up, not here.
  std::optional<HostPort> tcp;
  std::string tcp_token_file;
  bool tcp_allow_unauthenticated = false;
  bool operator==(const ListenConfig&) const = default;
};

// One named group of packs read by one reader pool (packs on one drive).
struct SourceGroupConfig {
  std::string name;
  std::vector<std::string> packs;  // resolved paths
  bool operator==(const SourceGroupConfig&) const = default;
};

// [[model]]: one served model. Relative paths are resolved against the config file's folder.
struct ModelConfig {
  std::string name;       // required, [A-Za-z0-9._-]+, unique
  std::string gguf;       // required: the GGUF file (first shard of a split model)
  std::string index;      // optional v1/v2 index overlay ("" = none)
  std::string v1_q_pack;  // optional Q pack of a v1 index; needs `index`
  std::vector<SourceGroupConfig> source_groups;  // sorted by name; empty = one per device
  bool operator==(const ModelConfig&) const = default;
};

// [device]
struct DeviceConfig {
  enum class Kind { kAuto, kHost, kCuda };  // auto: CUDA when a driver and GPU are present
  Kind kind = Kind::kAuto;
  std::vector<int> cuda_devices = {0};    // CUDA ordinals served; unused with kind = host
  uint64_t slot_memory = 1ull << 30;      // bytes of slot arenas per device
  uint64_t staging_memory = 64ull << 20;  // bytes of pinned staging ring per device
  uint32_t copy_streams = 2;              // host-to-device copy streams per device, 1..64
  bool direct_copies = true;              // copy from registered pack mappings (readers mmap)
  // CUDA: IPC events the daemon process may hold (the driver's bound; 2 per slot + 1 per slot
  // per session), 2..1048576.
  uint32_t cuda_ipc_event_limit = 4096;
  bool operator==(const DeviceConfig&) const = default;
};

// [readers]: one reader pool per source group.
struct ReadersConfig {
  enum class Method { kPread, kDirect, kMmap };  // see src/pack/pack_set.h ReadMethod
  Method method = Method::kPread;
  uint32_t threads_per_group = 2;  // 1..64
  uint32_t max_eio_retries = 2;    // 0..100; retries of a read that failed with EIO
  bool operator==(const ReadersConfig&) const = default;
};

// [cache] (reloadable)
struct CacheConfig {
  enum class Policy { kCycle, kLru, kLfu };  // names as in src/engine/eviction_policy.h
  Policy policy = Policy::kCycle;
  bool operator==(const CacheConfig&) const = default;
};

// [predictor] (reloadable). `hints` is accepted too: the engine's predictor that adds nothing
// itself and relies on client prefetch hints (src/engine/predictor.h).
struct PredictorConfig {
  enum class Kind { kHistory, kNone, kHints };
  Kind kind = Kind::kHistory;
  uint32_t lookahead = 4;       // MoE layers ahead, >= 1
  uint32_t max_experts = 12;    // experts predicted per layer, >= 1
  uint32_t history_tokens = 4;  // routes remembered per layer, >= 1
  bool operator==(const PredictorConfig&) const = default;
};

// [limits]: what one client may hold, and how long the daemon waits.
struct LimitsConfig {
  uint32_t max_sessions = 64;
  uint32_t max_leases_per_session = 1024;
  uint32_t max_experts_per_acquire = 64;
  // Slots one session may hold at once (its leases plus its acquires in flight), per model;
  // 0 = half of the model's slots, but never fewer than one acquire of max_experts_per_acquire
  // (nor more than the model has).
  uint32_t max_slots_per_session = 0;
  // A lease older than this whose session sent nothing for as long is reclaimed.
  std::chrono::milliseconds lease_ttl{60'000};
  // How long an OpenSession waits for its Session stream to attach before it is dropped.
  std::chrono::milliseconds session_attach_timeout{10'000};
  uint64_t max_message_bytes = 4ull << 20;  // gRPC send/receive limit, 1KiB..2GiB-1 (an int)
  // On SIGTERM, how long leases may drain before the daemon exits anyway. Keep it below the
  // unit's TimeoutStopSec= or systemd kills the daemon mid-drain.
  std::chrono::milliseconds drain_timeout{10'000};
  bool operator==(const LimitsConfig&) const = default;
};

// [lane]: the per-session request lane in shared memory (docs/protocol.md, "The request lane").
struct LaneConfig {
  bool enabled = true;  // false: every session uses its gRPC stream for everything
  // How long a session's lane thread keeps looking for the next request before it sleeps.
  uint32_t spin_us = 50;                    // 0..10000
  // Client-side hits: lane sessions pin resident experts themselves (host and CUDA models).
  bool client_hits = true;
  uint64_t request_ring_bytes = 64 << 10;   // multiples of 4 KiB, 64 KiB..16 MiB
  uint64_t response_ring_bytes = 256 << 10;
  bool operator==(const LaneConfig&) const = default;
};

// [logging]: `level` is reloadable, `format` is not.
struct LoggingConfig {
  enum class Level { kTrace, kDebug, kInfo, kWarn, kError, kOff };
  enum class Format { kText, kJson };
  Level level = Level::kInfo;
  Format format = Format::kText;
  bool operator==(const LoggingConfig&) const = default;
};

// [metrics]: Prometheus text endpoint; nullopt = off. Unauthenticated: bind it to loopback or a
// management network.
struct MetricsConfig {
  std::optional<HostPort> listen;
  bool operator==(const MetricsConfig&) const = default;
};

// [demo]: used only when the daemon runs with its demo flag (a synthetic model, no [[model]]).
struct DemoConfig {
  std::string cache_dir;                // "" = DefaultDemoCacheDir(env)
  std::string preset = "mixtral-tiny";  // a src/synth preset; checked when the demo starts
  bool operator==(const DemoConfig&) const = default;
};

struct DaemonConfig {
  ListenConfig listen;
  std::vector<ModelConfig> models;  // the [[model]] tables, in file order
  DeviceConfig device;
  ReadersConfig readers;
  CacheConfig cache;
  PredictorConfig predictor;
  LimitsConfig limits;
  LaneConfig lane;
  LoggingConfig logging;
  MetricsConfig metrics;
  DemoConfig demo;
  bool operator==(const DaemonConfig&) const = default;
};

// Every key at its documented default; no models.
DaemonConfig DefaultConfig();

// Parses `toml_text`; `source_name` names it in errors and its folder resolves relative paths
// (use the file's path; a name without a folder leaves relative paths as written). Runs
// ValidateConfig. Errors: InvalidArgument (ErrorKind kBadValue), one line per problem.
absl::StatusOr<DaemonConfig> ParseConfig(std::string_view toml_text, std::string_view source_name);
// Reads and parses the file at `path` (made absolute first, so relative model paths are
// resolved against the file's folder whatever the working directory). A missing file is
// NotFound; a file that cannot be read is Unavailable.
absl::StatusOr<DaemonConfig> LoadConfig(const std::string& path);

// Rules spanning several keys, for a config changed by flags after parsing: TCP authentication,
// device list, model names/paths/source groups, socket path length. Messages name the keys.
absl::Status ValidateConfig(const DaemonConfig& config);
// Serving needs at least one [[model]]; the demo mode does not, so this is a separate check.
// FailedPrecondition when there is none.
absl::Status RequireModels(const DaemonConfig& config);

// The socket path when listen.unix_socket is empty: $RUNTIME_DIRECTORY/expertd.sock (systemd's
// RuntimeDirectory=; the first of several colon-separated folders), else
// $XDG_RUNTIME_DIR/expertd/expertd.sock, else /run/expertd/expertd.sock. Relative values of these
// variables are ignored, as the XDG spec asks.
std::string DefaultSocketPath(const Environment& env);
// Every place the default socket may be, in that order (clients look for the first that exists,
// so a shell with XDG_RUNTIME_DIR set still finds a system service under /run/expertd).
std::vector<std::string> SocketPathCandidates(const Environment& env);
std::string ResolveSocketPath(const ListenConfig& listen, const Environment& env);
// The demo cache when demo.cache_dir is empty: $XDG_CACHE_HOME/expertd/demo, else
// $HOME/.cache/expertd/demo; FailedPrecondition when neither is set (set demo.cache_dir).
absl::StatusOr<std::string> DefaultDemoCacheDir(const Environment& env);
absl::StatusOr<std::string> ResolveDemoCacheDir(const DemoConfig& demo, const Environment& env);

// One line for the start-up log: models, device, readers, cache, predictor, listeners, logging.
std::string DescribeConfig(const DaemonConfig& config);

// SIGHUP: copies the reloadable keys (logging.level, cache.policy, predictor.*) from `fresh`
// into `live`, always. Returns FailedPrecondition listing the dotted keys (or "model") that
// differ between the two but need a restart; `live` keeps its values for those. OK otherwise.
absl::Status ApplyReloadable(const DaemonConfig& fresh, DaemonConfig& live);

// Value names as written in the TOML file.
std::string_view NameOf(DeviceConfig::Kind v);
std::string_view NameOf(ReadersConfig::Method v);
std::string_view NameOf(CacheConfig::Policy v);
std::string_view NameOf(PredictorConfig::Kind v);
std::string_view NameOf(LoggingConfig::Level v);
std::string_view NameOf(LoggingConfig::Format v);

}  // namespace expertd
