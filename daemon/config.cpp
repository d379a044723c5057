#include "config.h"

#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <set>
#include <span>
#include <tuple>
#include <utility>

#include "absl/strings/str_join.h"
#include "util/file.h"
#include "util/status.h"

namespace expertd {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

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
constexpr Named<DK> kDeviceKinds[] = {
    {"auto", DK::kAuto}, {"host", DK::kHost}, {"cuda", DK::kCuda}};
constexpr Named<RM> kMethods[] = {
    {"pread", RM::kPread}, {"direct", RM::kDirect}, {"mmap", RM::kMmap}};
constexpr Named<CP> kPolicies[] = {{"cycle", CP::kCycle}, {"lru", CP::kLru}, {"lfu", CP::kLfu}};
constexpr Named<PK> kPredictors[] = {
    {"history", PK::kHistory}, {"none", PK::kNone}, {"hints", PK::kHints}};
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
constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();
constexpr int64_t kMaxI32 = std::numeric_limits<int32_t>::max();

// One problem in a config. `key` is the full dotted path ("model[0].gguf"); a `why` starting
// with '[' continues the path ("[1]: ..." for an array element).
struct Problem {
  std::string key;
  std::string why;
};
std::string ProblemText(const Problem& p) {
  return absl::StrCat(p.key, !p.why.empty() && p.why[0] == '[' ? "" : ": ", p.why);
}

bool ValidName(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

std::string Quote(std::string_view s) { return absl::StrCat("\"", AV(s), "\""); }

std::string_view TypeName(const toml::node& n) {
  // Indexed by toml::node_type: none, table, array, string, integer, floating_point, boolean,
  // date, time, date_time.
  constexpr std::string_view kNames[] = {"nothing", "table",   "array", "string", "integer",
                                         "float",   "boolean", "date",  "time",   "date-time"};
  static_assert(static_cast<size_t>(toml::node_type::date_time) == 9);
  const auto i = static_cast<size_t>(n.type());
  return i < std::size(kNames) ? kNames[i] : "nothing";
}

// ---- converters: one TOML value to one typed value, or the reason it is invalid ----

template <typename T>
using Conv = std::function<absl::StatusOr<T>(const toml::node&)>;

absl::Status Expected(std::string_view what, const toml::node& n) {
  return absl::InvalidArgumentError(absl::StrCat("expected ", AV(what), ", got ", AV(TypeName(n))));
}

absl::StatusOr<std::string> AsString(const toml::node& n) {
  if (const auto* s = n.as_string()) return s->get();
  return Expected("a string", n);
}

absl::StatusOr<bool> AsBool(const toml::node& n) {
  if (const auto* b = n.as_boolean()) return b->get();
  return Expected("true or false", n);
}

template <typename T>
Conv<T> IntIn(int64_t lo, int64_t hi) {
  return [lo, hi](const toml::node& n) -> absl::StatusOr<T> {
    const auto* i = n.as_integer();
    if (i != nullptr && i->get() >= lo && i->get() <= hi) return static_cast<T>(i->get());
    return absl::InvalidArgumentError(
        absl::StrCat("expected an integer in ", lo, "..", hi, ", got ",
                     i ? absl::StrCat(i->get()) : std::string(AV(TypeName(n)))));
  };
}

template <typename T>
Conv<std::vector<T>> IntArray(int64_t lo, int64_t hi) {
  return [lo, hi](const toml::node& n) -> absl::StatusOr<std::vector<T>> {
    const auto* a = n.as_array();
    if (a == nullptr) return Expected("an array of integers", n);
    std::vector<T> out;
    for (size_t i = 0; i < a->size(); ++i) {
      absl::StatusOr<T> v = IntIn<T>(lo, hi)((*a)[i]);
      if (!v.ok())
        return absl::InvalidArgumentError(absl::StrCat("[", i, "]: ", v.status().message()));
      out.push_back(*v);
    }
    return out;
  };
}

template <typename E, size_t N>
Conv<E> OneOf(const Named<E> (&names)[N]) {
  return [&names](const toml::node& n) -> absl::StatusOr<E> {
    const auto* s = n.as_string();
    for (const auto& name : names) {
      if (s != nullptr && s->get() == name.name) return name.value;
    }
    std::string why = "expected one of ";
    for (size_t i = 0; i < N; ++i) absl::StrAppend(&why, i ? ", " : "", AV(names[i].name));
    absl::StrAppend(&why, ", got ", s ? Quote(s->get()) : std::string(AV(TypeName(n))));
    return absl::InvalidArgumentError(why);
  };
}

Conv<uint64_t> BytesIn(uint64_t lo, uint64_t hi) {
  return [lo, hi](const toml::node& n) -> absl::StatusOr<uint64_t> {
    absl::StatusOr<uint64_t> v = Expected("bytes (an integer or a string like \"512MiB\")", n);
    if (const auto* i = n.as_integer()) {
      if (i->get() < 0) return absl::InvalidArgumentError("expected a non-negative byte count");
      v = static_cast<uint64_t>(i->get());
    } else if (const auto* s = n.as_string()) {
      v = ParseByteSize(s->get());
    }
    if (v.ok() && (*v < lo || *v > hi)) {
      return absl::InvalidArgumentError(absl::StrCat("must be in ", FormatByteSize(lo), "..",
                                                     FormatByteSize(hi), ", got ",
                                                     FormatByteSize(*v)));
    }
    return v;
  };
}

Conv<milliseconds> DurationFrom(milliseconds lo) {
  return [lo](const toml::node& n) -> absl::StatusOr<milliseconds> {
    const auto* s = n.as_string();
    if (s == nullptr) return Expected("a duration string like \"30s\" (units ms, s, m, h)", n);
    absl::StatusOr<milliseconds> v = ParseDurationText(s->get());
    if (v.ok() && *v < lo) {
      return absl::InvalidArgumentError(absl::StrCat("must be at least ", FormatDuration(lo)));
    }
    return v;
  };
}

// File modes are octal strings: a bare `660` would be read by TOML as decimal 660 (01224).
absl::StatusOr<uint32_t> AsMode(const toml::node& n) {
  const auto* s = n.as_string();
  bool ok = s != nullptr && (s->get().size() == 3 || s->get().size() == 4);
  uint32_t mode = 0;
  for (size_t i = 0; ok && i < s->get().size(); ++i) {
    const char c = s->get()[i];
    ok = c >= '0' && c <= '7';
    mode = mode * 8 + static_cast<uint32_t>(c - '0');
  }
  if (ok && mode <= 0777) return mode;
  return absl::InvalidArgumentError(
      absl::StrCat("expected an octal permission string \"0000\"..\"0777\" like \"0660\", got ",
                   s ? Quote(s->get()) : std::string(AV(TypeName(n)))));
}

// "" = none.
absl::StatusOr<std::optional<HostPort>> AsHostPort(const toml::node& n) {
  ASSIGN_OR_RETURN(const std::string text, AsString(n));
  if (text.empty()) return std::nullopt;
  ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(text));
  return hp;
}

// ---- the walk over the parsed tree ----

// Collects every problem of one file with its position, so all are reported at once.
class Reader {
 public:
  // What to do with the value of one known key; `path` is its full dotted name.
  using Field =
      std::pair<std::string_view, std::function<void(const toml::node&, const std::string&)>>;

  Reader(std::string_view source, fs::path base) : source_(source), base_(std::move(base)) {}

  void Seen(const std::string& key, const toml::node& n) {
    positions_.emplace(key, n.source().begin);
  }
  void Error(const toml::node& at, std::string key, std::string why) {
    Seen(key, at);
    errored_.insert(key);
    problems_.push_back({std::move(key), std::move(why)});
  }

  // Hands each key of `t` to its field; keys without a field are reported as unknown.
  void ReadTable(const toml::table& t, const std::string& prefix,
                 const std::vector<Field>& fields) {
    for (auto&& [k, v] : t) {
      const std::string path =
          prefix.empty() ? std::string(k.str()) : absl::StrCat(prefix, ".", AV(k.str()));
      Seen(path, v);
      const std::string_view name = k.str();  // clang < 16 cannot capture structured bindings
      const auto f = std::find_if(fields.begin(), fields.end(),
                                  [name](const Field& field) { return field.first == name; });
      if (f != fields.end()) {
        f->second(v, path);
        continue;
      }
      std::string why = absl::StrCat(v.is_table() ? "unknown table" : "unknown key", "; valid keys",
                                     prefix.empty() ? "" : absl::StrCat(" in [", prefix, "]"), ":");
      for (const Field& field : fields) absl::StrAppend(&why, " ", AV(field.first));
      Error(v, path, std::move(why));
    }
  }

  // A field that converts the value with `conv` into `out`; `out` keeps its default on error.
  template <typename T>
  Field::second_type Into(T& out, Conv<T> conv) {
    return [this, &out, conv = std::move(conv)](const toml::node& n, const std::string& path) {
      absl::StatusOr<T> v = conv(n);
      if (v.ok()) {
        out = *std::move(v);
      } else {
        Error(n, path, std::string(v.status().message()));
      }
    };
  }
  // A path: relative values are resolved against the config file's folder.
  Field::second_type Path(std::string& out) {
    return Into<std::string>(out, [this](const toml::node& n) -> absl::StatusOr<std::string> {
      ASSIGN_OR_RETURN(const std::string raw, AsString(n));
      return Resolve(raw);
    });
  }
  std::string Resolve(const std::string& raw) const {
    if (raw.empty() || base_.empty() || fs::path(raw).is_absolute()) return raw;
    return (base_ / raw).lexically_normal().string();
  }
  // A [section] whose keys are `fields` (which must outlive the walk).
  Field::second_type Section(const std::vector<Field>& fields) {
    return [this, &fields](const toml::node& n, const std::string& path) {
      if (const auto* t = n.as_table()) {
        ReadTable(*t, path, fields);
      } else {
        Error(n, path, absl::StrCat("expected a table [", path, "], got ", AV(TypeName(n))));
      }
    };
  }

  // Cross-key problems from Validate, except for keys already reported.
  void AddValidation(std::vector<Problem> problems) {
    for (Problem& p : problems) {
      if (errored_.count(p.key) == 0) problems_.push_back(std::move(p));
    }
  }

  // One line per problem, "FILE:LINE:COL: key: why", in file order. A key that was not written
  // (a required one) takes the position of its nearest written parent.
  absl::Status Result() const {
    if (problems_.empty()) return absl::OkStatus();
    std::vector<std::tuple<uint32_t, uint32_t, std::string>> lines;
    for (const Problem& p : problems_) {
      std::string key = p.key;
      auto it = positions_.find(key);
      while (it == positions_.end() && key.find_last_of(".[") != std::string::npos) {
        key.resize(key.find_last_of(".["));
        it = positions_.find(key);
      }
      if (it == positions_.end()) {
        lines.emplace_back(std::numeric_limits<uint32_t>::max(), 0,
                           absl::StrCat(AV(source_), ": ", ProblemText(p)));
      } else {
        const toml::source_position at = it->second;
        lines.emplace_back(
            at.line, at.column,
            absl::StrCat(AV(source_), ":", at.line, ":", at.column, ": ", ProblemText(p)));
      }
    }
    std::stable_sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) {
      return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
    });
    std::string message;
    for (const auto& l : lines)
      absl::StrAppend(&message, message.empty() ? "" : "\n", std::get<2>(l));
    return InvalidError(ErrorKind::kBadValue, message);
  }

 private:
  std::string source_;
  fs::path base_;
  std::vector<Problem> problems_;
  std::set<std::string> errored_;
  std::map<std::string, toml::source_position> positions_;
};

// [model.source_groups]: group name = [pack paths].
void ReadSourceGroups(Reader& r, const toml::table& t, const std::string& path,
                      std::vector<SourceGroupConfig>& out) {
  for (auto&& [name, packs] : t) {
    const std::string key = absl::StrCat(path, ".", AV(name.str()));
    r.Seen(key, packs);
    const auto* list = packs.as_array();
    SourceGroupConfig group{std::string(name.str()), {}};
    for (size_t j = 0; list != nullptr && j < list->size() && (*list)[j].is_string(); ++j) {
      group.packs.push_back(r.Resolve((*list)[j].as_string()->get()));
    }
    if (list == nullptr || group.packs.size() != list->size()) {
      r.Error(packs, key,
              list != nullptr
                  ? std::string("every pack must be a path string")
                  : absl::StrCat("expected an array of pack paths, got ", AV(TypeName(packs))));
      continue;
    }
    out.push_back(std::move(group));
  }
}

void ReadModels(Reader& r, const toml::node& n, std::vector<ModelConfig>& models) {
  const auto* a = n.as_array();
  if (a == nullptr || (!a->empty() && !a->is_array_of_tables())) {
    r.Error(n, "model", "expected an array of tables: write each model as [[model]]");
    return;
  }
  models.resize(a->size());
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string p = absl::StrCat("model[", i, "]");
    r.Seen(p, (*a)[i]);
    ModelConfig& m = models[i];
    std::vector<SourceGroupConfig>& groups = m.source_groups;
    r.ReadTable(*(*a)[i].as_table(), p,
                {{"name", r.Into<std::string>(m.name, AsString)},
                 {"gguf", r.Path(m.gguf)},
                 {"index", r.Path(m.index)},
                 {"v1_q_pack", r.Path(m.v1_q_pack)},
                 {"source_groups", [&](const toml::node& g, const std::string& path) {
                    if (const auto* t = g.as_table()) return ReadSourceGroups(r, *t, path, groups);
                    r.Error(g, path,
                            absl::StrCat("expected a table of group name = [pack paths], got ",
                                         AV(TypeName(g))));
                  }}});
  }
}

void ReadRoot(Reader& r, const toml::table& root, DaemonConfig& c) {
  // (uid_t)-1 means "no change" to chown and is never a real user or group.
  constexpr int64_t kMaxId = std::numeric_limits<uint32_t>::max() - 1;
  ListenConfig& l = c.listen;
  DeviceConfig& d = c.device;
  ReadersConfig& rd = c.readers;
  PredictorConfig& pr = c.predictor;
  LimitsConfig& lim = c.limits;
  const std::vector<Reader::Field> listen = {
      {"unix_socket", r.Path(l.unix_socket)},
      {"socket_mode", r.Into<uint32_t>(l.socket_mode, AsMode)},
      {"directory_mode", r.Into<uint32_t>(l.directory_mode, AsMode)},
      {"allowed_uids", r.Into(l.allowed_uids, IntArray<uint32_t>(0, kMaxId))},
      {"allowed_gids", r.Into(l.allowed_gids, IntArray<uint32_t>(0, kMaxId))},
      {"tcp", r.Into<std::optional<HostPort>>(l.tcp, AsHostPort)},
      {"tcp_token_file", r.Path(l.tcp_token_file)},
      {"tcp_allow_unauthenticated", r.Into<bool>(l.tcp_allow_unauthenticated, AsBool)}};
  const std::vector<Reader::Field> device = {
      {"kind", r.Into(d.kind, OneOf(kDeviceKinds))},
      {"cuda_devices", r.Into(d.cuda_devices, IntArray<int>(0, 1023))},
      {"slot_memory", r.Into(d.slot_memory, BytesIn(1, kMaxU64))},
      {"staging_memory", r.Into(d.staging_memory, BytesIn(1, kMaxU64))},
      {"copy_streams", r.Into(d.copy_streams, IntIn<uint32_t>(1, 64))},
      {"direct_copies", r.Into<bool>(d.direct_copies, AsBool)},
      {"cuda_ipc_event_limit", r.Into(d.cuda_ipc_event_limit, IntIn<uint32_t>(2, 1u << 20))}};
  const std::vector<Reader::Field> readers = {
      {"method", r.Into(rd.method, OneOf(kMethods))},
      {"threads_per_group", r.Into(rd.threads_per_group, IntIn<uint32_t>(1, 64))},
      {"max_eio_retries", r.Into(rd.max_eio_retries, IntIn<uint32_t>(0, 100))}};
  const std::vector<Reader::Field> cache = {{"policy", r.Into(c.cache.policy, OneOf(kPolicies))}};
  const std::vector<Reader::Field> predictor = {
      {"kind", r.Into(pr.kind, OneOf(kPredictors))},
      {"lookahead", r.Into(pr.lookahead, IntIn<uint32_t>(1, 1024))},
      {"max_experts", r.Into(pr.max_experts, IntIn<uint32_t>(1, 4096))},
      {"history_tokens", r.Into(pr.history_tokens, IntIn<uint32_t>(1, 1024))}};
  const std::vector<Reader::Field> limits = {
      {"max_sessions", r.Into(lim.max_sessions, IntIn<uint32_t>(1, kMaxI32))},
      {"max_leases_per_session", r.Into(lim.max_leases_per_session, IntIn<uint32_t>(1, kMaxI32))},
      {"max_experts_per_acquire", r.Into(lim.max_experts_per_acquire, IntIn<uint32_t>(1, kMaxI32))},
      {"max_slots_per_session", r.Into(lim.max_slots_per_session, IntIn<uint32_t>(0, kMaxI32))},
      {"lease_ttl", r.Into(lim.lease_ttl, DurationFrom(milliseconds(1)))},
      {"session_attach_timeout", r.Into(lim.session_attach_timeout, DurationFrom(milliseconds(1)))},
      // gRPC takes the limit as an int.
      {"max_message_bytes", r.Into(lim.max_message_bytes, BytesIn(1024, kMaxI32))},
      {"drain_timeout", r.Into(lim.drain_timeout, DurationFrom(milliseconds(0)))}};
  const std::vector<Reader::Field> lane = {
      {"enabled", r.Into<bool>(c.lane.enabled, AsBool)},
      {"spin_us", r.Into(c.lane.spin_us, IntIn<uint32_t>(0, 10000))},
      {"client_hits", r.Into<bool>(c.lane.client_hits, AsBool)},
      {"request_ring_bytes", r.Into(c.lane.request_ring_bytes, BytesIn(64 << 10, 16 << 20))},
      {"response_ring_bytes", r.Into(c.lane.response_ring_bytes, BytesIn(64 << 10, 16 << 20))}};
  const std::vector<Reader::Field> logging = {
      {"level", r.Into(c.logging.level, OneOf(kLevels))},
      {"format", r.Into(c.logging.format, OneOf(kFormats))}};
  const std::vector<Reader::Field> metrics = {
      {"listen", r.Into<std::optional<HostPort>>(c.metrics.listen, AsHostPort)}};
  const std::vector<Reader::Field> demo = {
      {"cache_dir", r.Path(c.demo.cache_dir)},
      {"preset", r.Into<std::string>(c.demo.preset, AsString)}};
  r.ReadTable(
      root, "",
      {{"listen", r.Section(listen)},
       {"model", [&](const toml::node& n, const std::string&) { ReadModels(r, n, c.models); }},
       {"device", r.Section(device)},
       {"readers", r.Section(readers)},
       {"cache", r.Section(cache)},
       {"predictor", r.Section(predictor)},
       {"limits", r.Section(limits)},
       {"lane", r.Section(lane)},
       {"logging", r.Section(logging)},
       {"metrics", r.Section(metrics)},
       {"demo", r.Section(demo)}});
}

std::vector<Problem> Validate(const DaemonConfig& c) {
  std::vector<Problem> out;
  const ListenConfig& l = c.listen;
  if (l.unix_socket.size() > kMaxSocketPath) {
    out.push_back({"listen.unix_socket",
                   absl::StrCat("path is ", l.unix_socket.size(),
                                " bytes; a Unix socket path holds at most ", kMaxSocketPath)});
  }
  for (const auto& [key, bytes] : {std::pair{"lane.request_ring_bytes", c.lane.request_ring_bytes},
                                   std::pair{"lane.response_ring_bytes", c.lane.response_ring_bytes}}) {
    if (bytes % 4096 != 0) out.push_back({key, "must be a multiple of 4 KiB"});
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
      out.push_back({"listen.tcp",
                     "a TCP listener needs listen.tcp_token_file "
                     "(or tcp_allow_unauthenticated = true on a loopback host)"});
    } else if (!token && !IsLoopbackHost(l.tcp->host)) {
      out.push_back({"listen.tcp", absl::StrCat("host ", Quote(l.tcp->host),
                                                " is not loopback (127.0.0.1, ::1, localhost); "
                                                "without listen.tcp_token_file TCP is refused")});
    }
  }
  if (c.device.kind != DK::kHost && c.device.cuda_devices.empty()) {
    out.push_back(
        {"device.cuda_devices", "must list at least one CUDA device unless device.kind is host"});
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
        out.push_back(
            {p + ".name", absl::StrCat(Quote(m.name), " is already used by model[", j, "]")});
      }
    }
    if (m.gguf.empty()) out.push_back({p + ".gguf", "required key missing"});
    if (!m.v1_q_pack.empty() && m.index.empty()) {
      out.push_back(
          {p + ".v1_q_pack",
           absl::StrCat("needs ", p, ".index (the v1 index says which experts the Q pack holds)")});
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
          out.push_back(
              {key, absl::StrCat("pack ", Quote(pack), " is also in group ", Quote(it->second))});
        }
      }
    }
  }
  if (c.demo.preset.empty()) out.push_back({"demo.preset", "must not be empty"});
  return out;
}


}  // namespace

DaemonConfig DefaultConfig() { return DaemonConfig{}; }

absl::StatusOr<DaemonConfig> ParseConfig(std::string_view toml_text, std::string_view source_name) {
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
  RETURN_IF_ERROR(
      file.ReadAt(0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(text.data()), text.size())));
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
      " direct_copies=", c.device.direct_copies ? "on" : "off",
      " readers=", AV(NameOf(c.readers.method)), " threads_per_group=", c.readers.threads_per_group,
      " cache=", AV(NameOf(c.cache.policy)), " predictor=", AV(NameOf(c.predictor.kind)),
      " lookahead=", c.predictor.lookahead, " max_experts=", c.predictor.max_experts,
      " unix=", c.listen.unix_socket.empty() ? "default" : c.listen.unix_socket,
      " tcp=", hp(c.listen.tcp),
      c.listen.tcp && c.listen.tcp_token_file.empty() ? "(no token)" : "",
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
  diff("device.direct_copies", fd.direct_copies, ld.direct_copies);
  diff("device.cuda_ipc_event_limit", fd.cuda_ipc_event_limit, ld.cuda_ipc_event_limit);
  diff("readers.method", fresh.readers.method, live.readers.method);
  diff("readers.threads_per_group", fresh.readers.threads_per_group,
       live.readers.threads_per_group);
  diff("readers.max_eio_retries", fresh.readers.max_eio_retries, live.readers.max_eio_retries);
  const LimitsConfig &fm = fresh.limits, &lm = live.limits;
  diff("limits.max_sessions", fm.max_sessions, lm.max_sessions);
  diff("limits.max_leases_per_session", fm.max_leases_per_session, lm.max_leases_per_session);
  diff("limits.max_experts_per_acquire", fm.max_experts_per_acquire, lm.max_experts_per_acquire);
  diff("limits.max_slots_per_session", fm.max_slots_per_session, lm.max_slots_per_session);
  diff("limits.lease_ttl", fm.lease_ttl, lm.lease_ttl);
  diff("limits.session_attach_timeout", fm.session_attach_timeout, lm.session_attach_timeout);
  diff("limits.max_message_bytes", fm.max_message_bytes, lm.max_message_bytes);
  diff("limits.drain_timeout", fm.drain_timeout, lm.drain_timeout);
  diff("lane.enabled", fresh.lane.enabled, live.lane.enabled);
  diff("lane.spin_us", fresh.lane.spin_us, live.lane.spin_us);
  diff("lane.client_hits", fresh.lane.client_hits, live.lane.client_hits);
  diff("lane.request_ring_bytes", fresh.lane.request_ring_bytes, live.lane.request_ring_bytes);
  diff("lane.response_ring_bytes", fresh.lane.response_ring_bytes, live.lane.response_ring_bytes);
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
