#include "config.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <set>
#include <span>
#include <toml++/toml.h>
#include <tuple>
#include <utility>

#include "absl/strings/str_join.h"
#include "util/file.h"
#include "util/status.h"

extern char** environ;  // NOLINT: POSIX, declared only with _GNU_SOURCE

namespace expertd {
namespace {

namespace fs = std::filesystem;

template <typename E>
struct Named {
  std::string_view name;
  E value;
};
using DK = DeviceConfig::Kind;
using RM = ReadersConfig::Method;
using CP = CacheConfig::Policy;
using PK = PredictorConfig::Kind;
using LL = LoggingConfig::Level;
using LF = LoggingConfig::Format;
constexpr Named<DK> kDeviceKinds[] = {{"auto", DK::kAuto}, {"host", DK::kHost}, {"cuda", DK::kCuda}};
constexpr Named<RM> kMethods[] = {{"pread", RM::kPread}, {"direct", RM::kDirect}, {"mmap", RM::kMmap}};
constexpr Named<CP> kPolicies[] = {{"cycle", CP::kCycle}, {"lru", CP::kLru}, {"lfu", CP::kLfu}};
constexpr Named<PK> kPredictors[] = {{"history", PK::kHistory}, {"none", PK::kNone}, {"hints", PK::kHints}};
constexpr Named<LL> kLevels[] = {{"trace", LL::kTrace}, {"debug", LL::kDebug}, {"info", LL::kInfo},
                                 {"warn", LL::kWarn},   {"error", LL::kError}, {"off", LL::kOff}};
constexpr Named<LF> kFormats[] = {{"text", LF::kText}, {"json", LF::kJson}};

template <typename E, size_t N>
std::string_view NameIn(const Named<E> (&names)[N], E v) {
  for (const auto& n : names) {
    if (n.value == v) return n.name;
  }
  return "?";
}

constexpr size_t kMaxSocketPath = 107;  // sizeof(sockaddr_un::sun_path) - 1 for the NUL
constexpr uint64_t kMaxConfigBytes = 1 << 20;

// One problem in a config. `key` is the full dotted path ("model[0].gguf").
struct Problem {
  std::string key;
  std::string why;
};

bool ValidName(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
  });
}

bool ParseDigits(std::string_view s, size_t& i, uint64_t& value) {
  const size_t start = i;
  value = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    value = value * 10 + d;
  }
  return i > start;
}

std::string Quote(std::string_view s) { return absl::StrCat("\"", AV(s), "\""); }

std::string_view TypeName(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    case toml::node_type::array: return "array";
    case toml::node_type::table: return "table";
    default: return "nothing";
  }
}

// Walks the parsed TOML tree into a DaemonConfig, collecting every problem with its position.
class Reader {
 public:
  Reader(std::string_view source, fs::path base) : source_(source), base_(std::move(base)) {}

  void Error(const toml::node& at, std::string key, std::string why) {
    Seen(key, at);
    errored_.insert(key);
    problems_.push_back({std::move(key), std::move(why)});
  }
  void Seen(const std::string& key, const toml::node& n) {
    positions_.emplace(key, n.source().begin);
  }
  // Reports keys of `t` not in `known`.
  void CheckKeys(const toml::table& t, std::string_view prefix,
                 std::initializer_list<std::string_view> known) {
    for (auto&& [k, v] : t) {
      if (std::find(known.begin(), known.end(), k.str()) != known.end()) continue;
      Error(v, Join(prefix, k.str()),
            absl::StrCat(v.is_table() ? "unknown table" : "unknown key", "; valid keys",
                         prefix.empty() ? "" : absl::StrCat(" in [", AV(prefix), "]"), ": ",
                         absl::StrJoin(known, ", ", [](std::string* o, std::string_view s) {
                           absl::StrAppend(o, AV(s));
                         })));
    }
  }

  static std::string Join(std::string_view prefix, std::string_view key) {
    return prefix.empty() ? std::string(key) : absl::StrCat(AV(prefix), ".", AV(key));
  }

  // Each Read* leaves `out` alone when the key is absent or invalid (the error is recorded).
  const toml::node* Get(const toml::table& t, std::string_view prefix, std::string_view key,
                        std::string& path) {
    const toml::node* n = t.get(key);
    path = Join(prefix, key);
    if (n != nullptr) Seen(path, *n);
    return n;
  }
  void ReadString(const toml::table& t, std::string_view prefix, std::string_view key,
                  std::string& out) {
    std::string path;
    const toml::node* n = Get(t, prefix, key, path);
    if (n == nullptr) return;
    if (const auto* s = n->as_string()) {
      out = s->get();
    } else {
      Error(*n, path, absl::StrCat("expected a string, got ", AV(TypeName(*n))));
    }
  }
  void ReadPath(const toml::table& t, std::string_view prefix, std::string_view key,
                std::string& out) {
    std::string raw = out;
    ReadString(t, prefix, key, raw);
    out = Resolve(raw);
  }
  std::string Resolve(const std::string& raw) const {
    if (raw.empty() || base_.empty() || fs::path(raw).is_absolute()) return raw;
    return (base_ / raw).lexically_normal().string();
  }
  void ReadBool(const toml::table& t, std::string_view prefix, std::string_view key, bool& out) {
    std::string path;
    const toml::node* n = Get(t, prefix, key, path);
    if (n == nullptr) return;
    if (const auto* b = n->as_boolean()) {
      out = b->get();
    } else {
      Error(*n, path, absl::StrCat("expected true or false, got ", AV(TypeName(*n))));
    }
  }
  template <typename T>
  bool IntValue(const toml::node& n, const std::string& path, int64_t lo, int64_t hi, T& out) {
    const auto* i = n.as_integer();
    if (i == nullptr || i->get() < lo || i->get() > hi) {
      Error(n, path,
            absl::StrCat("expected an integer in ", lo, "..", hi, ", got ",
                         i ? absl::StrCat(i->get()) : std::string(AV(TypeName(n)))));
      return false;
    }
    out = static_cast<T>(i->get());
    return true;
  }
  template <typename T>
  void ReadInt(const toml::table& t, std::string_view prefix, std::string_view key, int64_t lo,
               int64_t hi, T& out) {
    std::string path;
    if (const toml::node* n = Get(t, prefix, key, path)) IntValue(*n, path, lo, hi, out);
  }
  template <typename T>
  void ReadIntArray(const toml::table& t, std::string_view prefix, std::string_view key,
                    int64_t lo, int64_t hi, std::vector<T>& out) {
    std::string path;
    const toml::node* n = Get(t, prefix, key, path);
    if (n == nullptr) return;
    const auto* a = n->as_array();
    if (a == nullptr) {
      Error(*n, path, absl::StrCat("expected an array of integers, got ", AV(TypeName(*n))));
      return;
    }
    std::vector<T> values;
    bool ok = true;
    for (size_t i = 0; i < a->size(); ++i) {
      T v{};
      ok = IntValue((*a)[i], absl::StrCat(path, "[", i, "]"), lo, hi, v) && ok;
      values.push_back(v);
    }
    if (ok) out = std::move(values);
  }
  template <typename E, size_t N>
  void ReadEnum(const toml::table& t, std::string_view prefix, std::string_view key,
                const Named<E> (&names)[N], E& out) {
    std::string path;
    const toml::node* n = Get(t, prefix, key, path);
    if (n == nullptr) return;
    const auto* s = n->as_string();
    for (const auto& name : names) {
      if (s != nullptr && s->get() == name.name) {
        out = name.value;
        return;
      }
    }
    std::string why = "expected one of ";
    for (size_t i = 0; i < N; ++i) absl::StrAppend(&why, i ? ", " : "", AV(names[i].name));
    absl::StrAppend(&why, ", got ", s ? Quote(s->get()) : std::string(AV(TypeName(*n))));
    Error(*n, path, std::move(why));
  }
  void ReadBytes(const toml::table& t, std::string_view prefix, std::string_view key, uint64_t lo,
                 uint64_t hi, uint64_t& out) {
    std::string path;
    const toml::node* n = Get(t, prefix, key, path);
    if (n == nullptr) return;
    absl::StatusOr<uint64_t> v = absl::InvalidArgumentError(
        absl::StrCat("expected bytes (an integer or a string like \"512MiB\"), got ",
                     AV(TypeName(*n))));
    if (const auto* i = n->as_integer()) {
      v = i->get() >= 0 ? absl::StatusOr<uint64_t>(static_cast<uint64_t>(i->get()))
                        : absl::InvalidArgumentError("expected a non-negative byte count");
    } else if (const auto* s = n->as_string()) {
      v = ParseByteSize(s->get());
    }
    if (v.ok() && (*v < lo || *v > hi)) {
      v = absl::InvalidArgumentError(absl::StrCat("must be in ", FormatByteSize(lo), "..",
                                                  FormatByteSize(hi), ", got ",
                                                  FormatByteSize(*v)));
    }
    if (v.ok()) {
      out = *v;
    } else {
      Error(*n, path, std::string(v.status().message()));
    }
  }
  void ReadDuration(const toml::table& t, std::string_view prefix, std::string_view key,
                    std::chrono::milliseconds lo, std::chrono::milliseconds& out) {
    std::string path;
    const toml::node* n = Get(t, prefix, key, path);
    if (n == nullptr) return;
    absl::StatusOr<std::chrono::milliseconds> v = absl::InvalidArgumentError(absl::StrCat(
        "expected a duration string like \"30s\" (units ms, s, m, h), got ", AV(TypeName(*n))));
    if (const auto* s = n->as_string()) v = ParseDurationText(s->get());
    if (v.ok() && *v < lo) {
      v = absl::InvalidArgumentError(absl::StrCat("must be at least ", FormatDuration(lo)));
    }
    if (v.ok()) {
      out = *v;
    } else {
      Error(*n, path, std::string(v.status().message()));
    }
  }
  // File modes are octal strings: a bare `660` would be read by TOML as decimal 660 (01224).
  void ReadMode(const toml::table& t, std::string_view prefix, std::string_view key,
                uint32_t& out) {
    std::string path;
    const toml::node* n = Get(t, prefix, key, path);
    if (n == nullptr) return;
    const auto* s = n->as_string();
    uint32_t mode = 0;
    bool ok = s != nullptr && (s->get().size() == 3 || s->get().size() == 4);
    for (size_t i = 0; ok && i < s->get().size(); ++i) {
      const char c = s->get()[i];
      ok = c >= '0' && c <= '7';
      mode = mode * 8 + static_cast<uint32_t>(c - '0');
    }
    if (ok && mode <= 0777) {
      out = mode;
    } else {
      Error(*n, path,
            absl::StrCat("expected an octal permission string \"0000\"..\"0777\" like \"0660\", "
                         "got ",
                         s ? Quote(s->get()) : std::string(AV(TypeName(*n)))));
    }
  }
  void ReadHostPort(const toml::table& t, std::string_view prefix, std::string_view key,
                    std::optional<HostPort>& out) {
    std::string text;
    std::string path;
    const toml::node* n = Get(t, prefix, key, path);
    if (n == nullptr) return;
    ReadString(t, prefix, key, text);
    if (errored_.count(path) != 0) return;
    if (text.empty()) {
      out.reset();
      return;
    }
    absl::StatusOr<HostPort> hp = ParseHostPort(text);
    if (hp.ok()) {
      out = *std::move(hp);
    } else {
      Error(*n, path, std::string(hp.status().message()));
    }
  }

  // Cross-key problems from ValidateConfig, placed at the key or its nearest written parent.
  void AddValidation(std::vector<Problem> problems) {
    for (Problem& p : problems) {
      if (errored_.count(p.key) == 0) problems_.push_back(std::move(p));
    }
  }

  absl::Status Result() const {
    if (problems_.empty()) return absl::OkStatus();
    struct Line {
      uint32_t line, column;
      std::string text;
    };
    std::vector<Line> lines;
    for (const Problem& p : problems_) {
      std::string key = p.key;
      auto it = positions_.find(key);
      while (it == positions_.end() && key.find_last_of(".[") != std::string::npos) {
        key.resize(key.find_last_of(".["));
        it = positions_.find(key);
      }
      if (it != positions_.end()) {
        lines.push_back({it->second.line, it->second.column,
                         absl::StrCat(AV(source_), ":", it->second.line, ":", it->second.column,
                                      ": ", p.key, ": ", p.why)});
      } else {
        lines.push_back({std::numeric_limits<uint32_t>::max(), 0,
                         absl::StrCat(AV(source_), ": ", p.key, ": ", p.why)});
      }
    }
    std::stable_sort(lines.begin(), lines.end(), [](const Line& a, const Line& b) {
      return std::tie(a.line, a.column) < std::tie(b.line, b.column);
    });
    std::string message;
    for (const Line& l : lines) absl::StrAppend(&message, message.empty() ? "" : "\n", l.text);
    return InvalidError(ErrorKind::kBadValue, message);
  }

 private:
  std::string source_;
  fs::path base_;
  std::vector<Problem> problems_;
  std::set<std::string> errored_;
  std::map<std::string, toml::source_position> positions_;
};

// Returns the table at `key` of `root`, or null when absent or not a table (reported).
const toml::table* Section(Reader& r, const toml::table& root, std::string_view key) {
  const toml::node* n = root.get(key);
  if (n == nullptr) return nullptr;
  r.Seen(std::string(key), *n);
  if (const auto* t = n->as_table()) return t;
  r.Error(*n, std::string(key), absl::StrCat("expected a table [", AV(key), "], got ",
                                             AV(TypeName(*n))));
  return nullptr;
}

void ReadListen(Reader& r, const toml::table& t, ListenConfig& c) {
  constexpr std::string_view p = "listen";
  r.CheckKeys(t, p,
              {"unix_socket", "socket_mode", "directory_mode", "allowed_uids", "allowed_gids",
               "tcp", "tcp_token_file", "tcp_allow_unauthenticated"});
  r.ReadPath(t, p, "unix_socket", c.unix_socket);
  r.ReadMode(t, p, "socket_mode", c.socket_mode);
  r.ReadMode(t, p, "directory_mode", c.directory_mode);
  // (uid_t)-1 means "no change" to chown and is never a real user.
  constexpr int64_t kMaxId = std::numeric_limits<uint32_t>::max() - 1;
  r.ReadIntArray(t, p, "allowed_uids", 0, kMaxId, c.allowed_uids);
  r.ReadIntArray(t, p, "allowed_gids", 0, kMaxId, c.allowed_gids);
  r.ReadHostPort(t, p, "tcp", c.tcp);
  r.ReadPath(t, p, "tcp_token_file", c.tcp_token_file);
  r.ReadBool(t, p, "tcp_allow_unauthenticated", c.tcp_allow_unauthenticated);
}

void ReadModels(Reader& r, const toml::node& n, std::vector<ModelConfig>& models) {
  static const toml::table kNoGroups;
  const auto* a = n.as_array();
  if (a == nullptr || (!a->empty() && !a->is_array_of_tables())) {
    r.Error(n, "model", "expected an array of tables: write each model as [[model]]");
    return;
  }
  for (size_t i = 0; i < a->size(); ++i) {
    const toml::table& t = *(*a)[i].as_table();
    const std::string p = absl::StrCat("model[", i, "]");
    r.Seen(p, t);
    r.CheckKeys(t, p, {"name", "gguf", "index", "v1_q_pack", "source_groups"});
    ModelConfig m;
    r.ReadString(t, p, "name", m.name);
    r.ReadPath(t, p, "gguf", m.gguf);
    r.ReadPath(t, p, "index", m.index);
    r.ReadPath(t, p, "v1_q_pack", m.v1_q_pack);
    std::string gp;
    if (const toml::node* g = r.Get(t, p, "source_groups", gp)) {
      const auto* groups = g->as_table();
      if (groups == nullptr) {
        r.Error(*g, gp, absl::StrCat("expected a table of group name = [pack paths], got ",
                                     AV(TypeName(*g))));
      }
      for (auto&& [name, packs] : groups != nullptr ? *groups : kNoGroups) {
        const std::string key = Reader::Join(gp, name.str());
        r.Seen(key, packs);
        const auto* list = packs.as_array();
        SourceGroupConfig group{std::string(name.str()), {}};
        for (size_t j = 0; list != nullptr && j < list->size(); ++j) {
          const auto* s = (*list)[j].as_string();
          if (s == nullptr) break;
          group.packs.push_back(r.Resolve(s->get()));
        }
        if (list == nullptr || group.packs.size() != list->size()) {
          r.Error(packs, key,
                  list != nullptr ? std::string("every pack must be a path string")
                                  : absl::StrCat("expected an array of pack paths, got ",
                                                 AV(TypeName(packs))));
          continue;
        }
        m.source_groups.push_back(std::move(group));
      }
    }
    models.push_back(std::move(m));
  }
}

void ReadRoot(Reader& r, const toml::table& root, DaemonConfig& c) {
  r.CheckKeys(root, "",
              {"listen", "model", "device", "readers", "cache", "predictor", "limits", "logging",
               "metrics", "demo"});
  if (const auto* t = Section(r, root, "listen")) ReadListen(r, *t, c.listen);
  if (const toml::node* m = root.get("model")) ReadModels(r, *m, c.models);
  if (const auto* t = Section(r, root, "device")) {
    r.CheckKeys(*t, "device",
                {"kind", "cuda_devices", "slot_memory", "staging_memory", "copy_streams"});
    r.ReadEnum(*t, "device", "kind", kDeviceKinds, c.device.kind);
    r.ReadIntArray(*t, "device", "cuda_devices", 0, 1023, c.device.cuda_devices);
    r.ReadBytes(*t, "device", "slot_memory", 1, std::numeric_limits<uint64_t>::max(),
                c.device.slot_memory);
    r.ReadBytes(*t, "device", "staging_memory", 1, std::numeric_limits<uint64_t>::max(),
                c.device.staging_memory);
    r.ReadInt(*t, "device", "copy_streams", 1, 64, c.device.copy_streams);
  }
  if (const auto* t = Section(r, root, "readers")) {
    r.CheckKeys(*t, "readers", {"method", "threads_per_group", "max_eio_retries"});
    r.ReadEnum(*t, "readers", "method", kMethods, c.readers.method);
    r.ReadInt(*t, "readers", "threads_per_group", 1, 64, c.readers.threads_per_group);
    r.ReadInt(*t, "readers", "max_eio_retries", 0, 100, c.readers.max_eio_retries);
  }
  if (const auto* t = Section(r, root, "cache")) {
    r.CheckKeys(*t, "cache", {"policy"});
    r.ReadEnum(*t, "cache", "policy", kPolicies, c.cache.policy);
  }
  if (const auto* t = Section(r, root, "predictor")) {
    r.CheckKeys(*t, "predictor", {"kind", "lookahead", "max_experts", "history_tokens"});
    r.ReadEnum(*t, "predictor", "kind", kPredictors, c.predictor.kind);
    r.ReadInt(*t, "predictor", "lookahead", 1, 1024, c.predictor.lookahead);
    r.ReadInt(*t, "predictor", "max_experts", 1, 4096, c.predictor.max_experts);
    r.ReadInt(*t, "predictor", "history_tokens", 1, 1024, c.predictor.history_tokens);
  }
  if (const auto* t = Section(r, root, "limits")) {
    constexpr std::string_view p = "limits";
    r.CheckKeys(*t, p,
                {"max_sessions", "max_leases_per_session", "max_experts_per_acquire", "lease_ttl",
                 "session_attach_timeout", "max_message_bytes", "drain_timeout"});
    constexpr int64_t kMaxCount = std::numeric_limits<int32_t>::max();
    r.ReadInt(*t, p, "max_sessions", 1, kMaxCount, c.limits.max_sessions);
    r.ReadInt(*t, p, "max_leases_per_session", 1, kMaxCount, c.limits.max_leases_per_session);
    r.ReadInt(*t, p, "max_experts_per_acquire", 1, kMaxCount, c.limits.max_experts_per_acquire);
    r.ReadDuration(*t, p, "lease_ttl", std::chrono::milliseconds(1), c.limits.lease_ttl);
    r.ReadDuration(*t, p, "session_attach_timeout", std::chrono::milliseconds(1),
                   c.limits.session_attach_timeout);
    // gRPC takes the limit as an int.
    r.ReadBytes(*t, p, "max_message_bytes", 1024, std::numeric_limits<int32_t>::max(),
                c.limits.max_message_bytes);
    r.ReadDuration(*t, p, "drain_timeout", std::chrono::milliseconds(0), c.limits.drain_timeout);
  }
  if (const auto* t = Section(r, root, "logging")) {
    r.CheckKeys(*t, "logging", {"level", "format"});
    r.ReadEnum(*t, "logging", "level", kLevels, c.logging.level);
    r.ReadEnum(*t, "logging", "format", kFormats, c.logging.format);
  }
  if (const auto* t = Section(r, root, "metrics")) {
    r.CheckKeys(*t, "metrics", {"listen"});
    r.ReadHostPort(*t, "metrics", "listen", c.metrics.listen);
  }
  if (const auto* t = Section(r, root, "demo")) {
    r.CheckKeys(*t, "demo", {"cache_dir", "preset"});
    r.ReadPath(*t, "demo", "cache_dir", c.demo.cache_dir);
    r.ReadString(*t, "demo", "preset", c.demo.preset);
  }
}

std::vector<Problem> Validate(const DaemonConfig& c) {
  std::vector<Problem> out;
  const ListenConfig& l = c.listen;
  if (l.unix_socket.size() > kMaxSocketPath) {
    out.push_back({"listen.unix_socket",
                   absl::StrCat("path is ", l.unix_socket.size(), " bytes; a Unix socket path "
                                "holds at most ", kMaxSocketPath)});
  }
  if ((l.directory_mode & 0700) != 0700) {
    out.push_back({"listen.directory_mode",
                   "must include 0700: the daemon creates and removes its socket there"});
  }
  if (l.tcp.has_value()) {
    const bool token = !l.tcp_token_file.empty();
    if (token && l.tcp_allow_unauthenticated) {
      out.push_back({"listen.tcp_allow_unauthenticated",
                     "cannot be true together with listen.tcp_token_file; remove one"});
    } else if (!token && !l.tcp_allow_unauthenticated) {
      out.push_back({"listen.tcp", "a TCP listener needs listen.tcp_token_file (or "
                                   "tcp_allow_unauthenticated = true on a loopback host)"});
    } else if (!token && !IsLoopbackHost(l.tcp->host)) {
      out.push_back({"listen.tcp",
                     absl::StrCat("host ", Quote(l.tcp->host), " is not loopback (127.0.0.1, ::1, "
                                  "localhost); without listen.tcp_token_file TCP is refused")});
    }
  }
  if (c.device.kind != DK::kHost && c.device.cuda_devices.empty()) {
    out.push_back({"device.cuda_devices", "must list at least one CUDA device unless device.kind "
                                          "is host"});
  }
  for (size_t i = 0; i < c.device.cuda_devices.size(); ++i) {
    const int d = c.device.cuda_devices[i];
    const auto first = std::find(c.device.cuda_devices.begin(), c.device.cuda_devices.end(), d);
    if (d < 0 || first != c.device.cuda_devices.begin() + static_cast<ptrdiff_t>(i)) {
      out.push_back({absl::StrCat("device.cuda_devices[", i, "]"),
                     absl::StrCat("device ", d, d < 0 ? " is negative" : " is listed twice")});
    }
  }
  for (size_t i = 0; i < c.models.size(); ++i) {
    const ModelConfig& m = c.models[i];
    const std::string p = absl::StrCat("model[", i, "]");
    if (m.name.empty()) {
      out.push_back({p + ".name", "required key missing"});
    } else if (!ValidName(m.name)) {
      out.push_back({p + ".name", absl::StrCat(Quote(m.name), " may only use A-Z a-z 0-9 . _ -")});
    }
    for (size_t j = 0; j < i; ++j) {
      if (!m.name.empty() && c.models[j].name == m.name) {
        out.push_back({p + ".name", absl::StrCat(Quote(m.name), " is already used by model[",
                                                 j, "]")});
      }
    }
    if (m.gguf.empty()) out.push_back({p + ".gguf", "required key missing"});
    if (!m.v1_q_pack.empty() && m.index.empty()) {
      out.push_back({p + ".v1_q_pack", absl::StrCat("needs ", p, ".index (the v1 index that "
                                                    "says which experts the Q pack holds)")});
    }
    std::map<std::string, std::string> owner;  // pack -> group
    for (const SourceGroupConfig& g : m.source_groups) {
      const std::string key = absl::StrCat(p, ".source_groups.", g.name);
      if (!ValidName(g.name)) {
        out.push_back({key, "group names may only use A-Z a-z 0-9 . _ -"});
      }
      if (g.packs.empty()) out.push_back({key, "lists no packs"});
      for (const std::string& pack : g.packs) {
        if (pack.empty()) out.push_back({key, "has an empty pack path"});
        auto [it, fresh] = owner.emplace(pack, g.name);
        if (!fresh) {
          out.push_back({key, absl::StrCat("pack ", Quote(pack), " is also in group ",
                                           Quote(it->second))});
        }
      }
    }
  }
  if (c.demo.preset.empty()) out.push_back({"demo.preset", "must not be empty"});
  return out;
}

std::string JoinEnvPath(std::string_view dir, std::string_view tail) {
  return (fs::path(std::string(dir)) / std::string(tail)).string();
}

}  // namespace

std::string Environment::Get(std::string_view name) const {
  auto it = vars.find(name);
  return it == vars.end() ? std::string() : it->second;
}

Environment Environment::FromProcess() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string_view::npos) env.vars.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

absl::StatusOr<HostPort> ParseHostPort(std::string_view text) {
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected \"HOST:PORT\" (IPv6 as \"[::1]:PORT\"), got ", Quote(text), ": ",
                     AV(why)));
  };
  HostPort hp;
  std::string_view rest;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("missing ']'");
    hp.host = std::string(text.substr(1, close - 1));
    rest = text.substr(close + 1);
    if (hp.host.find(':') == std::string::npos) return bad("brackets are for IPv6 addresses");
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("missing ':PORT'");
    hp.host = std::string(text.substr(0, colon));
    rest = text.substr(colon);
    if (hp.host.find(':') != std::string::npos) return bad("put an IPv6 address in brackets");
  }
  if (hp.host.empty()) return bad("empty host");
  if (hp.host.find_first_of(" \t/") != std::string::npos) return bad("invalid host");
  if (rest.empty() || rest.front() != ':') return bad("missing ':PORT'");
  size_t i = 1;
  uint64_t port = 0;
  if (!ParseDigits(rest, i, port) || i != rest.size() || port > 65535) {
    return bad("port must be 0..65535");
  }
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

std::string FormatHostPort(const HostPort& hp) {
  return hp.host.find(':') != std::string::npos ? absl::StrCat("[", hp.host, "]:", hp.port)
                                                : absl::StrCat(hp.host, ":", hp.port);
}

bool IsLoopbackHost(std::string_view host) {
  return host == "127.0.0.1" || host == "::1" || host == "localhost";
}

absl::StatusOr<uint64_t> ParseByteSize(std::string_view text) {
  constexpr std::pair<std::string_view, int> kUnits[] = {
      {"B", 0}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}};
  size_t i = 0;
  uint64_t value = 0;
  if (!ParseDigits(text, i, value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a size like \"512MiB\" (units B, KiB, MiB, GiB, TiB), got ", Quote(text)));
  }
  if (i < text.size() && text[i] == ' ') ++i;
  const std::string_view unit = text.substr(i);
  for (const auto& [name, shift] : kUnits) {
    if (unit != name) continue;
    if (value > (std::numeric_limits<uint64_t>::max() >> shift)) {
      return absl::InvalidArgumentError(absl::StrCat(Quote(text), " does not fit in 64 bits"));
    }
    return value << shift;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      Quote(text), ": ", unit.empty() ? "missing unit" : absl::StrCat("unit ", Quote(unit)),
      "; use B, KiB, MiB, GiB or TiB (binary units only; a bare integer means bytes)"));
}

std::string FormatByteSize(uint64_t bytes) {
  constexpr std::pair<std::string_view, int> kUnits[] = {
      {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}};
  for (const auto& [name, shift] : kUnits) {
    const uint64_t unit = uint64_t{1} << shift;
    if (bytes != 0 && bytes % unit == 0) return absl::StrCat(bytes / unit, AV(name));
  }
  return absl::StrCat(bytes, "B");
}

absl::StatusOr<std::chrono::milliseconds> ParseDurationText(std::string_view text) {
  constexpr std::pair<std::string_view, int64_t> kUnits[] = {
      {"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}};
  size_t i = 0;
  uint64_t value = 0;
  const bool digits = ParseDigits(text, i, value);
  if (i < text.size() && text[i] == ' ') ++i;
  const std::string_view unit = text.substr(i);
  for (const auto& [name, ms] : kUnits) {
    if (!digits || unit != name) continue;
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / ms)) break;
    return std::chrono::milliseconds(static_cast<int64_t>(value) * ms);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "expected a duration like \"30s\" (a whole number with unit ms, s, m or h), got ",
      Quote(text)));
}

std::string FormatDuration(std::chrono::milliseconds d) {
  const int64_t ms = d.count();
  if (ms != 0 && ms % 3'600'000 == 0) return absl::StrCat(ms / 3'600'000, "h");
  if (ms != 0 && ms % 60'000 == 0) return absl::StrCat(ms / 60'000, "m");
  if (ms % 1000 == 0) return absl::StrCat(ms / 1000, "s");
  return absl::StrCat(ms, "ms");
}

DaemonConfig DefaultConfig() { return DaemonConfig{}; }

absl::StatusOr<DaemonConfig> ParseConfig(std::string_view toml_text,
                                         std::string_view source_name) {
  DaemonConfig config;
  Reader reader(source_name, fs::path(std::string(source_name)).parent_path());
  try {
    const toml::table root = toml::parse(toml_text, source_name);
    ReadRoot(reader, root, config);
  } catch (const toml::parse_error& e) {
    const toml::source_position at = e.source().begin;
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat(AV(source_name), ":", at.line, ":", at.column,
                                     ": TOML syntax error: ", AV(e.description())));
  } catch (const std::exception& e) {  // allocation failure and the like: nothing may escape
    return absl::InternalError(absl::StrCat(AV(source_name), ": ", e.what()));
  }
  reader.AddValidation(Validate(config));
  RETURN_IF_ERROR(reader.Result());
  return config;
}

absl::StatusOr<DaemonConfig> LoadConfig(const std::string& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  const std::string name = ec ? path : absolute.lexically_normal().string();
  ASSIGN_OR_RETURN(ReadFile file, ReadFile::Open(name));
  if (file.size() > kMaxConfigBytes) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat(name, ": ", file.size(), " bytes; a config file is at most ",
                                     kMaxConfigBytes));
  }
  std::string text(file.size(), '\0');
  RETURN_IF_ERROR(file.ReadAt(
      0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(text.data()), text.size())));
  return ParseConfig(text, name);
}

absl::Status ValidateConfig(const DaemonConfig& config) {
  std::vector<std::string> lines;
  for (const Problem& p : Validate(config)) lines.push_back(absl::StrCat(p.key, ": ", p.why));
  if (lines.empty()) return absl::OkStatus();
  return InvalidError(ErrorKind::kBadValue, absl::StrJoin(lines, "\n"));
}

absl::Status RequireModels(const DaemonConfig& config) {
  if (!config.models.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "no [[model]] in the config: add one (see configs/expertd.toml) or run the demo");
}

std::string DefaultSocketPath(const Environment& env) {
  const std::string runtime = env.Get("RUNTIME_DIRECTORY");
  const std::string first = runtime.substr(0, runtime.find(':'));
  if (fs::path(first).is_absolute()) return JoinEnvPath(first, "expertd.sock");
  const std::string xdg = env.Get("XDG_RUNTIME_DIR");
  if (fs::path(xdg).is_absolute()) return JoinEnvPath(xdg, "expertd/expertd.sock");
  return "/run/expertd/expertd.sock";
}

std::string ResolveSocketPath(const ListenConfig& listen, const Environment& env) {
  return listen.unix_socket.empty() ? DefaultSocketPath(env) : listen.unix_socket;
}

absl::StatusOr<std::string> DefaultDemoCacheDir(const Environment& env) {
  const std::string xdg = env.Get("XDG_CACHE_HOME");
  if (fs::path(xdg).is_absolute()) return JoinEnvPath(xdg, "expertd/demo");
  const std::string home = env.Get("HOME");
  if (fs::path(home).is_absolute()) return JoinEnvPath(home, ".cache/expertd/demo");
  return absl::FailedPreconditionError(
      "demo.cache_dir is empty and neither XDG_CACHE_HOME nor HOME is set; set demo.cache_dir");
}

absl::StatusOr<std::string> ResolveDemoCacheDir(const DemoConfig& demo, const Environment& env) {
  if (!demo.cache_dir.empty()) return demo.cache_dir;
  return DefaultDemoCacheDir(env);
}

std::string DescribeConfig(const DaemonConfig& c) {
  std::string models;
  for (const ModelConfig& m : c.models) absl::StrAppend(&models, models.empty() ? "" : ",", m.name);
  std::string devices;
  for (int d : c.device.cuda_devices) absl::StrAppend(&devices, devices.empty() ? "" : ",", d);
  const auto hp = [](const std::optional<HostPort>& v) {
    return v ? FormatHostPort(*v) : std::string("off");
  };
  return absl::StrCat(
      "models=[", models, "] device=", AV(NameOf(c.device.kind)), " cuda=[", devices,
      "] slots=", FormatByteSize(c.device.slot_memory),
      " staging=", FormatByteSize(c.device.staging_memory), " streams=", c.device.copy_streams,
      " readers=", AV(NameOf(c.readers.method)), " threads_per_group=",
      c.readers.threads_per_group, " cache=", AV(NameOf(c.cache.policy)),
      " predictor=", AV(NameOf(c.predictor.kind)), " lookahead=", c.predictor.lookahead,
      " max_experts=", c.predictor.max_experts, " unix=", c.listen.unix_socket.empty() ? "default" : c.listen.unix_socket,
      " tcp=", hp(c.listen.tcp), c.listen.tcp && c.listen.tcp_token_file.empty() ? "(no token)" : "",
      " metrics=", hp(c.metrics.listen), " log=", AV(NameOf(c.logging.level)), "/",
      AV(NameOf(c.logging.format)));
}

absl::Status ApplyReloadable(const DaemonConfig& fresh, DaemonConfig& live) {
  live.logging.level = fresh.logging.level;
  live.cache = fresh.cache;
  live.predictor = fresh.predictor;
  std::vector<std::string> keys;
  const auto diff = [&keys](std::string_view key, const auto& a, const auto& b) {
    if (!(a == b)) keys.emplace_back(key);
  };
  const ListenConfig &fl = fresh.listen, &ll = live.listen;
  diff("listen.unix_socket", fl.unix_socket, ll.unix_socket);
  diff("listen.socket_mode", fl.socket_mode, ll.socket_mode);
  diff("listen.directory_mode", fl.directory_mode, ll.directory_mode);
  diff("listen.allowed_uids", fl.allowed_uids, ll.allowed_uids);
  diff("listen.allowed_gids", fl.allowed_gids, ll.allowed_gids);
  diff("listen.tcp", fl.tcp, ll.tcp);
  diff("listen.tcp_token_file", fl.tcp_token_file, ll.tcp_token_file);
  diff("listen.tcp_allow_unauthenticated", fl.tcp_allow_unauthenticated,
       ll.tcp_allow_unauthenticated);
  diff("model", fresh.models, live.models);
  const DeviceConfig &fd = fresh.device, &ld = live.device;
  diff("device.kind", fd.kind, ld.kind);
  diff("device.cuda_devices", fd.cuda_devices, ld.cuda_devices);
  diff("device.slot_memory", fd.slot_memory, ld.slot_memory);
  diff("device.staging_memory", fd.staging_memory, ld.staging_memory);
  diff("device.copy_streams", fd.copy_streams, ld.copy_streams);
  diff("readers.method", fresh.readers.method, live.readers.method);
  diff("readers.threads_per_group", fresh.readers.threads_per_group,
       live.readers.threads_per_group);
  diff("readers.max_eio_retries", fresh.readers.max_eio_retries, live.readers.max_eio_retries);
  const LimitsConfig &fm = fresh.limits, &lm = live.limits;
  diff("limits.max_sessions", fm.max_sessions, lm.max_sessions);
  diff("limits.max_leases_per_session", fm.max_leases_per_session, lm.max_leases_per_session);
  diff("limits.max_experts_per_acquire", fm.max_experts_per_acquire, lm.max_experts_per_acquire);
  diff("limits.lease_ttl", fm.lease_ttl, lm.lease_ttl);
  diff("limits.session_attach_timeout", fm.session_attach_timeout, lm.session_attach_timeout);
  diff("limits.max_message_bytes", fm.max_message_bytes, lm.max_message_bytes);
  diff("limits.drain_timeout", fm.drain_timeout, lm.drain_timeout);
  diff("logging.format", fresh.logging.format, live.logging.format);
  diff("metrics.listen", fresh.metrics.listen, live.metrics.listen);
  diff("demo.cache_dir", fresh.demo.cache_dir, live.demo.cache_dir);
  diff("demo.preset", fresh.demo.preset, live.demo.preset);
  // A key added to the struct but not to the list above still shows up, unnamed.
  if (keys.empty() && !(fresh == live)) keys.emplace_back("(unlisted key)");
  if (keys.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "changed but need a restart (kept at their running values): ", absl::StrJoin(keys, ", ")));
}

std::string_view NameOf(DeviceConfig::Kind v) { return NameIn(kDeviceKinds, v); }
std::string_view NameOf(ReadersConfig::Method v) { return NameIn(kMethods, v); }
std::string_view NameOf(CacheConfig::Policy v) { return NameIn(kPolicies, v); }
std::string_view NameOf(PredictorConfig::Kind v) { return NameIn(kPredictors, v); }
std::string_view NameOf(LoggingConfig::Level v) { return NameIn(kLevels, v); }
std::string_view NameOf(LoggingConfig::Format v) { return NameIn(kFormats, v); }

}  // namespace expertd
