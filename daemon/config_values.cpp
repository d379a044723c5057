// Value grammars of the config (sizes, durations, HOST:PORT) and the paths resolved from the
// environment (socket, demo cache). Split from config.cpp, which walks the TOML tree.
#include <algorithm>
#include <filesystem>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config.h"
#include "util/status.h"

extern char** environ;  // NOLINT: POSIX, declared only with _GNU_SOURCE

namespace expertd {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();

bool ParseDigits(std::string_view s, size_t& i, uint64_t& value) {
  const size_t start = i;
  value = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    const auto d = static_cast<uint64_t>(s[i] - '0');
    if (value > (kMaxU64 - d) / 10) return false;
    value = value * 10 + d;
  }
  return i > start;
}

std::string Quote(std::string_view s) { return absl::StrCat("\"", AV(s), "\""); }

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
    return absl::InvalidArgumentError(absl::StrCat(
        "expected \"HOST:PORT\" (IPv6 as \"[::1]:PORT\"), got ", Quote(text), ": ", AV(why)));
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

std::vector<std::string> SocketPathCandidates(const Environment& env) {
  std::vector<std::string> out;
  const std::string runtime = env.Get("RUNTIME_DIRECTORY");
  const std::string first = runtime.substr(0, runtime.find(':'));
  if (fs::path(first).is_absolute()) out.push_back(JoinEnvPath(first, "expertd.sock"));
  const std::string xdg = env.Get("XDG_RUNTIME_DIR");
  if (fs::path(xdg).is_absolute()) out.push_back(JoinEnvPath(xdg, "expertd/expertd.sock"));
  out.push_back("/run/expertd/expertd.sock");
  return out;
}

std::string DefaultSocketPath(const Environment& env) {
  return SocketPathCandidates(env).front();
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

}  // namespace expertd
