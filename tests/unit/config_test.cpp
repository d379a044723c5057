// The daemon's TOML configuration (daemon/config.h) and the shipped configs/expertd.toml.
// Expected defaults are the documented values, written out here, not read back from the code.
#include "config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include "support/test_support.h"

namespace expertd {

// gtest prints the one-line summary instead of a byte dump (found by ADL, so not in the
// anonymous namespace).
void PrintTo(const DaemonConfig& c, std::ostream* os) { *os << DescribeConfig(c); }

namespace {

using ::expertd::testing::IsError;
using ::expertd::testing::TempDir;
using ::expertd::testing::WriteFile;
using std::chrono::milliseconds;

constexpr std::string_view kSource = "/etc/expertd/cfg.toml";
const std::string kShipped = std::string(EXPERTD_SOURCE_DIR) + "/configs/expertd.toml";

absl::StatusOr<DaemonConfig> Parse(std::string_view text) { return ParseConfig(text, kSource); }

::testing::AssertionResult Bad(std::string_view text,
                               std::initializer_list<std::string_view> needles) {
  return IsError(Parse(text).status(), absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                 needles);
}

Environment Env(std::initializer_list<std::pair<const std::string, std::string>> vars) {
  Environment env;
  env.vars.insert(vars.begin(), vars.end());
  return env;
}

// ---- defaults and the shipped file ----

TEST(ConfigDefaults, AreTheDocumentedValues) {
  const DaemonConfig c = DefaultConfig();
  EXPECT_EQ(c.listen.unix_socket, "");
  EXPECT_EQ(c.listen.socket_mode, 0660u);
  EXPECT_EQ(c.listen.directory_mode, 0750u);
  EXPECT_TRUE(c.listen.allowed_uids.empty());
  EXPECT_TRUE(c.listen.allowed_gids.empty());
  EXPECT_FALSE(c.listen.tcp.has_value());
  EXPECT_EQ(c.listen.tcp_token_file, "");
  EXPECT_FALSE(c.listen.tcp_allow_unauthenticated);
  EXPECT_TRUE(c.models.empty());
  EXPECT_EQ(c.device.kind, DeviceConfig::Kind::kAuto);
  EXPECT_EQ(c.device.cuda_devices, std::vector<int>{0});
  EXPECT_EQ(c.device.slot_memory, uint64_t{1} << 30);
  EXPECT_EQ(c.device.staging_memory, uint64_t{64} << 20);
  EXPECT_EQ(c.device.copy_streams, 2u);
  EXPECT_EQ(c.readers.method, ReadersConfig::Method::kPread);
  EXPECT_EQ(c.readers.threads_per_group, 2u);
  EXPECT_EQ(c.readers.max_eio_retries, 2u);
  EXPECT_EQ(c.cache.policy, CacheConfig::Policy::kCycle);
  EXPECT_EQ(c.predictor.kind, PredictorConfig::Kind::kHistory);
  EXPECT_EQ(c.predictor.lookahead, 4u);
  EXPECT_EQ(c.predictor.max_experts, 12u);
  EXPECT_EQ(c.predictor.history_tokens, 4u);
  EXPECT_EQ(c.limits.max_sessions, 64u);
  EXPECT_EQ(c.limits.max_leases_per_session, 1024u);
  EXPECT_EQ(c.limits.max_experts_per_acquire, 64u);
  EXPECT_EQ(c.limits.max_slots_per_session, 0u);
  EXPECT_EQ(c.limits.lease_ttl, milliseconds(60'000));
  EXPECT_EQ(c.limits.session_attach_timeout, milliseconds(10'000));
  EXPECT_EQ(c.limits.max_message_bytes, uint64_t{4} << 20);
  EXPECT_EQ(c.limits.drain_timeout, milliseconds(10'000));
  EXPECT_TRUE(c.lane.enabled);
  EXPECT_EQ(c.lane.spin_us, 50u);
  EXPECT_EQ(c.lane.request_ring_bytes, uint64_t{64} << 10);
  EXPECT_EQ(c.lane.response_ring_bytes, uint64_t{256} << 10);
  EXPECT_EQ(c.logging.level, LoggingConfig::Level::kInfo);
  EXPECT_EQ(c.logging.format, LoggingConfig::Format::kText);
  EXPECT_FALSE(c.metrics.listen.has_value());
  EXPECT_EQ(c.demo.cache_dir, "");
  EXPECT_EQ(c.demo.preset, "mixtral-tiny");
}

TEST(ConfigDefaults, EmptyFileGivesDefaults) {
  absl::StatusOr<DaemonConfig> c = Parse("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, DefaultConfig());
  EXPECT_TRUE(ValidateConfig(DefaultConfig()).ok());
}

TEST(ConfigShipped, ParsesToTheDefaults) {
  absl::StatusOr<DaemonConfig> c = LoadConfig(kShipped);
  ASSERT_TRUE(c.ok()) << c.status();
  // ApplyReloadable names the restart-only keys that differ; the sections compare the rest.
  DaemonConfig probe = DefaultConfig();
  EXPECT_TRUE(ApplyReloadable(*c, probe).ok()) << ApplyReloadable(*c, probe);
  EXPECT_EQ(c->logging.level, DefaultConfig().logging.level);
  EXPECT_EQ(c->cache, DefaultConfig().cache);
  EXPECT_EQ(c->predictor, DefaultConfig().predictor);
  EXPECT_EQ(*c, DefaultConfig());
}

// Every key the parser knows, by section: the shipped file must set each one explicitly (so it
// documents it), and each must reject a value of the wrong type with its name.
const std::vector<std::pair<std::string, std::vector<std::string>>>& AllKeys() {
  static const auto* keys = new std::vector<std::pair<std::string, std::vector<std::string>>>{
      {"listen",
       {"unix_socket", "socket_mode", "directory_mode", "allowed_uids", "allowed_gids", "tcp",
        "tcp_token_file", "tcp_allow_unauthenticated"}},
      {"device",
       {"kind", "cuda_devices", "slot_memory", "staging_memory", "copy_streams", "direct_copies",
        "cuda_ipc_event_limit"}},
      {"readers", {"method", "threads_per_group", "max_eio_retries"}},
      {"cache", {"policy"}},
      {"predictor", {"kind", "lookahead", "max_experts", "history_tokens"}},
      {"limits",
       {"max_sessions", "max_leases_per_session", "max_experts_per_acquire",
        "max_slots_per_session", "lease_ttl", "session_attach_timeout", "max_message_bytes",
        "drain_timeout"}},
      {"lane", {"enabled", "spin_us", "client_hits", "request_ring_bytes", "response_ring_bytes"}},
      {"logging", {"level", "format"}},
      {"metrics", {"listen"}},
      {"demo", {"cache_dir", "preset"}},
  };
  return *keys;
}

TEST(ConfigShipped, SetsEveryKeyAndDocumentsTheModelExample) {
  std::istringstream in(testing::ReadWholeFile(kShipped));
  std::set<std::string> set_keys;
  std::string section, line, model_example;
  bool in_example = false;
  while (std::getline(in, line)) {
    if (line == "# [[model]]") in_example = true;
    if (in_example && line.rfind("# ", 0) != 0) in_example = false;
    if (in_example) model_example += line.substr(2) + "\n";
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    set_keys.insert(section + "." + line.substr(0, line.find(' ')));
  }
  std::set<std::string> expected;
  for (const auto& [s, keys] : AllKeys()) {
    for (const std::string& k : keys) expected.insert(absl::StrCat(s, ".", k));
  }
  EXPECT_EQ(set_keys, expected);

  // The commented example is a valid model once uncommented.
  ASSERT_FALSE(model_example.empty());
  absl::StatusOr<DaemonConfig> c = Parse(model_example);
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << model_example;
  ASSERT_EQ(c->models.size(), 1u);
  EXPECT_EQ(c->models[0].name, "mixtral");
  EXPECT_FALSE(c->models[0].index.empty());
  EXPECT_FALSE(c->models[0].v1_q_pack.empty());
  EXPECT_EQ(c->models[0].source_groups.size(), 2u);
  EXPECT_TRUE(RequireModels(*c).ok());
}

TEST(ConfigErrors, EveryKeyRejectsAWrongTypeByName) {
  for (const auto& [section, keys] : AllKeys()) {
    for (const std::string& key : keys) {
      const std::string text = absl::StrCat("\n[", section, "]\n", key, " = 1.5\n");
      EXPECT_TRUE(Bad(text, {"cfg.toml:3:", absl::StrCat(section, ".", key, ": "), "got float"}))
          << text;
    }
  }
  for (const std::string key : {"name", "gguf", "index", "v1_q_pack", "source_groups"}) {
    const std::string text = "[[model]]\nname = \"m\"\ngguf = \"m.gguf\"\n" + key + " = 1.5\n";
    // A duplicate key is a TOML syntax error for name and gguf; the rest are type errors.
    if (key == "name" || key == "gguf") {
      EXPECT_TRUE(Bad(text, {"cfg.toml:4:", "TOML syntax error"})) << text;
    } else {
      EXPECT_TRUE(Bad(text, {"cfg.toml:4:", "model[0]." + key + ": ", "got float"})) << text;
    }
  }
}

// ---- unknown keys and tables ----

TEST(ConfigErrors, UnknownKeysAndTablesNameTheirPath) {
  EXPECT_TRUE(Bad("[listen]\nsockt = \"x\"\n",
                  {"cfg.toml:2:", "listen.sockt: unknown key", "valid keys in [listen]"}));
  EXPECT_TRUE(Bad("[listn]\nunix_socket = \"x\"\n", {"cfg.toml:1:", "listn: unknown table"}));
  EXPECT_TRUE(Bad("verbose = true\n", {"cfg.toml:1:", "verbose: unknown key"}));
  EXPECT_TRUE(Bad("[device.extra]\nx = 1\n", {"device.extra: unknown table"}));
  EXPECT_TRUE(Bad("[[model]]\nname = \"a\"\ngguf = \"a.gguf\"\nqpack = \"q\"\n",
                  {"cfg.toml:4:", "model[0].qpack: unknown key"}));
  EXPECT_TRUE(Bad("listen = 3\n", {"listen: expected a table [listen], got integer"}));
  EXPECT_TRUE(Bad("[model]\nname = \"a\"\n", {"model: expected an array of tables", "[[model]]"}));
}

TEST(ConfigErrors, EveryProblemIsReportedInFileOrder) {
  absl::Status s = Parse("[readers]\nmethod = \"aio\"\n[device]\ncopy_streams = 0\n").status();
  ASSERT_TRUE(IsError(s, absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                      {"readers.method", "device.copy_streams"}));
  const std::string m(s.message());
  EXPECT_LT(m.find("cfg.toml:2:"), m.find('\n'));
  EXPECT_NE(m.find("\n/etc/expertd/cfg.toml:4:"), std::string::npos) << m;
}

TEST(ConfigErrors, TomlSyntaxErrorHasFileLineColumn) {
  EXPECT_TRUE(Bad("[device]\nkind = \"cuda\"\ncopy_streams = = 2\n",
                  {"/etc/expertd/cfg.toml:3:", "TOML syntax error"}));
  EXPECT_TRUE(Bad("[device\n", {"cfg.toml:1:", "TOML syntax error"}));
  EXPECT_TRUE(Bad(std::string("a = \"\xff\"\n"), {"TOML syntax error"}));
}

// ---- invalid values ----

TEST(ConfigErrors, EnumValuesListTheChoices) {
  EXPECT_TRUE(Bad("[device]\nkind = \"gpu\"\n",
                  {"cfg.toml:2:8: device.kind: expected one of auto, host, cuda, got \"gpu\""}));
  EXPECT_TRUE(Bad("[readers]\nmethod = \"io_uring\"\n",
                  {"readers.method: expected one of pread, direct, mmap, got \"io_uring\""}));
  EXPECT_TRUE(
      Bad("[cache]\npolicy = \"belady\"\n", {"cache.policy: expected one of cycle, lru, lfu"}));
  EXPECT_TRUE(Bad("[predictor]\nkind = \"oracle\"\n", {"predictor.kind: expected one of history"}));
  EXPECT_TRUE(Bad("[logging]\nlevel = \"verbose\"\n",
                  {"logging.level: expected one of trace, debug, info, warn, error, off"}));
  EXPECT_TRUE(Bad("[logging]\nformat = \"xml\"\n", {"logging.format: expected one of text, json"}));
  EXPECT_TRUE(Bad("[device]\nkind = \"Auto\"\n", {"device.kind", "got \"Auto\""}));
}

TEST(ConfigErrors, RangesNameTheKeyAndTheLimits) {
  EXPECT_TRUE(Bad("[device]\ncopy_streams = 0\n",
                  {"device.copy_streams: expected an integer in 1..64, got 0"}));
  EXPECT_TRUE(Bad("[device]\ncuda_ipc_event_limit = 1\n",
                  {"device.cuda_ipc_event_limit", "2..1048576, got 1"}));
  EXPECT_TRUE(
      Bad("[readers]\nthreads_per_group = 65\n", {"readers.threads_per_group", "1..64, got 65"}));
  EXPECT_TRUE(Bad("[readers]\nmax_eio_retries = -1\n", {"readers.max_eio_retries", "got -1"}));
  EXPECT_TRUE(Bad("[predictor]\nlookahead = 0\n", {"predictor.lookahead", "got 0"}));
  EXPECT_TRUE(Bad("[predictor]\nmax_experts = 0\n", {"predictor.max_experts"}));
  EXPECT_TRUE(Bad("[predictor]\nhistory_tokens = 0\n", {"predictor.history_tokens"}));
  EXPECT_TRUE(Bad("[limits]\nmax_sessions = 0\n", {"limits.max_sessions"}));
  EXPECT_TRUE(Bad("[lane]\nresponse_ring_bytes = 70000\n",
                  {"lane.response_ring_bytes", "multiple of 4 KiB"}));
  EXPECT_TRUE(Bad("[lane]\nrequest_ring_bytes = \"32KiB\"\n", {"lane.request_ring_bytes"}));
  EXPECT_TRUE(Bad("[lane]\nspin_us = 20000\n", {"lane.spin_us"}));
  EXPECT_TRUE(Bad("[limits]\nmax_leases_per_session = 0\n", {"limits.max_leases_per_session"}));
  EXPECT_TRUE(Bad("[limits]\nmax_experts_per_acquire = 0\n", {"limits.max_experts_per_acquire"}));
  EXPECT_TRUE(Bad("[limits]\nmax_slots_per_session = -1\n", {"limits.max_slots_per_session"}));
  EXPECT_TRUE(Bad("[limits]\nlease_ttl = \"0s\"\n", {"limits.lease_ttl: must be at least 1ms"}));
  EXPECT_TRUE(
      Bad("[limits]\nsession_attach_timeout = \"0ms\"\n", {"limits.session_attach_timeout"}));
  EXPECT_TRUE(Bad("[limits]\nmax_message_bytes = \"2GiB\"\n",
                  {"limits.max_message_bytes: must be in 1KiB..", "got 2GiB"}));
  EXPECT_TRUE(Bad("[limits]\nmax_message_bytes = 100\n", {"limits.max_message_bytes", "got 100B"}));
  EXPECT_TRUE(Bad("[device]\nslot_memory = 0\n", {"device.slot_memory: must be in 1B.."}));
  EXPECT_TRUE(Bad("[device]\nstaging_memory = -5\n", {"device.staging_memory", "non-negative"}));
  EXPECT_TRUE(Bad("[device]\ncuda_devices = [0, -1]\n", {"device.cuda_devices[1]", "got -1"}));
  EXPECT_TRUE(Bad("[device]\ncuda_devices = [1, 1]\n",
                  {"device.cuda_devices[1]: device 1 is listed twice"}));
  EXPECT_TRUE(
      Bad("[device]\ncuda_devices = []\n", {"device.cuda_devices: must list at least one"}));
  EXPECT_TRUE(Bad("[device]\ncuda_devices = [\"0\"]\n", {"device.cuda_devices[0]", "got string"}));
  EXPECT_TRUE(Bad("[listen]\nallowed_uids = [-1]\n", {"listen.allowed_uids[0]", "got -1"}));
  EXPECT_TRUE(Bad("[listen]\nallowed_gids = [4294967295]\n", {"listen.allowed_gids[0]"}));
  EXPECT_TRUE(Bad("[demo]\npreset = \"\"\n", {"demo.preset: must not be empty"}));
  absl::StatusOr<DaemonConfig> host = Parse("[device]\nkind = \"host\"\ncuda_devices = []\n");
  EXPECT_TRUE(host.ok()) << host.status();  // the list is unused by the host device
  absl::StatusOr<DaemonConfig> zero = Parse("[limits]\ndrain_timeout = \"0s\"\n");
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->limits.drain_timeout, milliseconds(0));
}

TEST(ConfigErrors, ModesAreOctalStrings) {
  absl::StatusOr<DaemonConfig> c =
      Parse("[listen]\nsocket_mode = \"0600\"\ndirectory_mode = \"710\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen.socket_mode, 0600u);
  EXPECT_EQ(c->listen.directory_mode, 0710u);
  EXPECT_TRUE(Bad("[listen]\nsocket_mode = 660\n",
                  {"listen.socket_mode: expected an octal", "got integer"}));
  EXPECT_TRUE(Bad("[listen]\nsocket_mode = \"0698\"\n", {"listen.socket_mode", "got \"0698\""}));
  EXPECT_TRUE(Bad("[listen]\nsocket_mode = \"4660\"\n", {"listen.socket_mode"}));
  EXPECT_TRUE(Bad("[listen]\nsocket_mode = \"60\"\n", {"listen.socket_mode"}));
  EXPECT_TRUE(
      Bad("[listen]\ndirectory_mode = \"0550\"\n", {"listen.directory_mode: must include 0700"}));
}

TEST(ConfigErrors, UnixSocketPathMustFitSunPath) {
  const std::string path = "/" + std::string(106, 's');  // 107 bytes: fits
  EXPECT_TRUE(Parse("[listen]\nunix_socket = \"" + path + "\"\n").ok());
  EXPECT_TRUE(Bad("[listen]\nunix_socket = \"" + path + "x\"\n",
                  {"cfg.toml:2:", "listen.unix_socket: path is 108 bytes"}));
}

// ---- sizes and durations ----

TEST(ConfigByteSize, AcceptsBinaryUnitsOnly) {
  EXPECT_EQ(*ParseByteSize("8GiB"), uint64_t{8} << 30);
  EXPECT_EQ(*ParseByteSize("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("64KiB"), uint64_t{64} << 10);
  EXPECT_EQ(*ParseByteSize("2TiB"), uint64_t{2} << 40);
  EXPECT_EQ(*ParseByteSize("7B"), 7u);
  EXPECT_EQ(*ParseByteSize("3 MiB"), uint64_t{3} << 20);
  EXPECT_EQ(*ParseByteSize("0B"), 0u);
  for (std::string_view bad : {"1G", "1GB", "1K", "1kib", "1 GiB ", "1", "GiB", "", "1.5GiB",
                               "-1MiB", "1  MiB", "16777216TiB", "18446744073709551616B"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
  EXPECT_EQ(*ParseByteSize("16777215TiB"), uint64_t{16777215} << 40);
  EXPECT_NE(std::string(ParseByteSize("1G").status().message()).find("binary units only"),
            std::string::npos);
}

TEST(ConfigByteSize, TomlIntegersAreBytesAndErrorsNameTheKey) {
  absl::StatusOr<DaemonConfig> c =
      Parse("[device]\nslot_memory = 4096\nstaging_memory = \"8MiB\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device.slot_memory, 4096u);
  EXPECT_EQ(c->device.staging_memory, uint64_t{8} << 20);
  EXPECT_TRUE(Bad("[device]\nslot_memory = \"1G\"\n",
                  {"cfg.toml:2:", "device.slot_memory: \"1G\": unit \"G\"", "KiB"}));
}

TEST(ConfigByteSize, FormatPicksTheLargestExactUnit) {
  EXPECT_EQ(FormatByteSize(uint64_t{1} << 30), "1GiB");
  EXPECT_EQ(FormatByteSize(uint64_t{1536} << 20), "1536MiB");
  EXPECT_EQ(FormatByteSize(1000), "1000B");
  EXPECT_EQ(FormatByteSize(0), "0B");
}

TEST(ConfigDuration, AcceptsMsSecondsMinutesHours) {
  EXPECT_EQ(*ParseDurationText("30s"), milliseconds(30'000));
  EXPECT_EQ(*ParseDurationText("250ms"), milliseconds(250));
  EXPECT_EQ(*ParseDurationText("2m"), milliseconds(120'000));
  EXPECT_EQ(*ParseDurationText("1h"), milliseconds(3'600'000));
  EXPECT_EQ(*ParseDurationText("0s"), milliseconds(0));
  for (std::string_view bad :
       {"30", "1.5s", "30sec", "s", "", "-1s", "1d", "30S", "99999999999999999h"}) {
    EXPECT_FALSE(ParseDurationText(bad).ok()) << bad;
  }
  EXPECT_TRUE(
      Bad("[limits]\nlease_ttl = 60\n", {"limits.lease_ttl: expected a duration", "got integer"}));
  EXPECT_TRUE(Bad("[limits]\ndrain_timeout = \"10\"\n", {"limits.drain_timeout", "got \"10\""}));
  absl::StatusOr<DaemonConfig> c =
      Parse("[limits]\nlease_ttl = \"2m\"\nsession_attach_timeout = \"250ms\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->limits.lease_ttl, milliseconds(120'000));
  EXPECT_EQ(c->limits.session_attach_timeout, milliseconds(250));
  EXPECT_EQ(FormatDuration(milliseconds(60'000)), "1m");
  EXPECT_EQ(FormatDuration(milliseconds(10'000)), "10s");
  EXPECT_EQ(FormatDuration(milliseconds(1'500)), "1500ms");
}

// ---- models and paths ----

TEST(ConfigModels, RelativePathsResolveAgainstTheConfigFolder) {
  TempDir dir;
  const std::string cfg = dir.File("expertd.toml");
  WriteFile(cfg, R"([listen]
unix_socket = "run/e.sock"
tcp = "127.0.0.1:7070"
tcp_token_file = "secrets/token"
[[model]]
name = "mix.v1_Q4-K"
gguf = "models/../models/a.gguf"
index = "/abs/a.idx"
v1_q_pack = "q/a.q"
[model.source_groups]
nvme = ["models/a.gguf"]
optane = ["/mnt/q/a.q", "q/b.q"]
[demo]
cache_dir = "cache"
)");
  absl::StatusOr<DaemonConfig> c = LoadConfig(cfg);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string& d = dir.path();
  ASSERT_EQ(c->models.size(), 1u);
  const ModelConfig& m = c->models[0];
  EXPECT_EQ(m.name, "mix.v1_Q4-K");
  EXPECT_EQ(m.gguf, d + "/models/a.gguf");
  EXPECT_EQ(m.index, "/abs/a.idx");
  EXPECT_EQ(m.v1_q_pack, d + "/q/a.q");
  ASSERT_EQ(m.source_groups.size(), 2u);
  EXPECT_EQ(m.source_groups[0], (SourceGroupConfig{"nvme", {d + "/models/a.gguf"}}));
  EXPECT_EQ(m.source_groups[1], (SourceGroupConfig{"optane", {"/mnt/q/a.q", d + "/q/b.q"}}));
  EXPECT_EQ(c->listen.unix_socket, d + "/run/e.sock");
  EXPECT_EQ(c->listen.tcp_token_file, d + "/secrets/token");
  EXPECT_EQ(c->demo.cache_dir, d + "/cache");
  EXPECT_EQ(c->listen.tcp, (HostPort{"127.0.0.1", 7070}));

  // A source name without a folder leaves relative paths as written.
  absl::StatusOr<DaemonConfig> bare =
      ParseConfig("[[model]]\nname = \"a\"\ngguf = \"a.gguf\"\n", "inline");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->models[0].gguf, "a.gguf");
}

TEST(ConfigModels, RequiredKeysNamesAndGroupsAreChecked) {
  EXPECT_TRUE(Bad("[[model]]\ngguf = \"a.gguf\"\n",
                  {"cfg.toml:1:", "model[0].name: required key missing"}));
  EXPECT_TRUE(Bad("[[model]]\nname = \"a\"\n", {"model[0].gguf: required key missing"}));
  EXPECT_TRUE(
      Bad("[[model]]\nname = \"a b\"\ngguf = \"a\"\n", {"model[0].name: \"a b\" may only use"}));
  EXPECT_TRUE(Bad("[[model]]\nname = \"a\"\ngguf = \"a\"\n[[model]]\nname = \"a\"\ngguf = \"b\"\n",
                  {"cfg.toml:5:", "model[1].name: \"a\" is already used by model[0]"}));
  EXPECT_TRUE(Bad("[[model]]\nname = \"a\"\ngguf = \"a\"\nv1_q_pack = \"q\"\n",
                  {"model[0].v1_q_pack: needs model[0].index"}));
  EXPECT_TRUE(Bad(
      "[[model]]\nname = \"a\"\ngguf = \"a\"\n[model.source_groups]\nx = [\"/p\"]\ny = [\"/p\"]\n",
      {"model[0].source_groups.y: pack \"/p\" is also in group \"x\""}));
  EXPECT_TRUE(Bad("[[model]]\nname = \"a\"\ngguf = \"a\"\n[model.source_groups]\nx = []\n",
                  {"model[0].source_groups.x: lists no packs"}));
  EXPECT_TRUE(Bad("[[model]]\nname = \"a\"\ngguf = \"a\"\n[model.source_groups]\nx = \"/p\"\n",
                  {"model[0].source_groups.x: expected an array of pack paths, got string"}));
  EXPECT_TRUE(Bad("[[model]]\nname = \"a\"\ngguf = \"a\"\n[model.source_groups]\nx = [1]\n",
                  {"model[0].source_groups.x: every pack must be a path string"}));
  EXPECT_TRUE(
      Bad("[[model]]\nname = \"a\"\ngguf = \"a\"\n[model.source_groups]\n\"bad name\" = [\"/p\"]\n",
          {"source_groups.bad name: group names may only use"}));
  EXPECT_TRUE(Bad("[[model]]\nname = 7\ngguf = \"a\"\n",
                  {"model[0].name: expected a string, got integer"}));
}

TEST(ConfigModels, RequireModelsIsSeparate) {
  EXPECT_EQ(RequireModels(DefaultConfig()).code(), absl::StatusCode::kFailedPrecondition);
  DaemonConfig c = DefaultConfig();
  ModelConfig m;
  m.name = "m";
  m.gguf = "/m.gguf";
  c.models.push_back(m);
  EXPECT_TRUE(RequireModels(c).ok());
  EXPECT_TRUE(ValidateConfig(c).ok());
  m.gguf = "/n.gguf";
  c.models.push_back(m);
  EXPECT_TRUE(IsError(ValidateConfig(c), absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                      {"model[1].name: \"m\" is already used"}));
}

TEST(ConfigModels, LoadConfigErrors) {
  TempDir dir;
  absl::StatusOr<DaemonConfig> missing = LoadConfig(dir.File("nope.toml"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_NE(std::string(missing.status().message()).find("nope.toml"), std::string::npos);
  WriteFile(dir.File("bad.toml"), "[device]\nkind = \"gpu\"\n");
  EXPECT_TRUE(IsError(LoadConfig(dir.File("bad.toml")).status(), absl::StatusCode::kInvalidArgument,
                      ErrorKind::kBadValue, {dir.File("bad.toml") + ":2:", "device.kind"}));
}

// ---- environment-dependent defaults ----

TEST(ConfigSocketPath, ResolutionOrder) {
  EXPECT_EQ(DefaultSocketPath(Env(
                {{"RUNTIME_DIRECTORY", "/run/expertd"}, {"XDG_RUNTIME_DIR", "/run/user/1000"}})),
            "/run/expertd/expertd.sock");
  EXPECT_EQ(DefaultSocketPath(Env({{"RUNTIME_DIRECTORY", "/run/expertd:/run/other"}})),
            "/run/expertd/expertd.sock");
  EXPECT_EQ(DefaultSocketPath(Env({{"XDG_RUNTIME_DIR", "/run/user/1000/"}})),
            "/run/user/1000/expertd/expertd.sock");
  EXPECT_EQ(DefaultSocketPath(Env({{"RUNTIME_DIRECTORY", ""}, {"XDG_RUNTIME_DIR", "/x"}})),
            "/x/expertd/expertd.sock");
  // Relative values are ignored (XDG base directory spec).
  EXPECT_EQ(DefaultSocketPath(Env({{"RUNTIME_DIRECTORY", "run"}, {"XDG_RUNTIME_DIR", "tmp"}})),
            "/run/expertd/expertd.sock");
  EXPECT_EQ(DefaultSocketPath(Env({})), "/run/expertd/expertd.sock");
  ListenConfig l;
  EXPECT_EQ(ResolveSocketPath(l, Env({{"XDG_RUNTIME_DIR", "/x"}})), "/x/expertd/expertd.sock");
  l.unix_socket = "/srv/e.sock";
  EXPECT_EQ(ResolveSocketPath(l, Env({{"XDG_RUNTIME_DIR", "/x"}})), "/srv/e.sock");
}

TEST(ConfigDemoCacheDir, ResolutionOrder) {
  EXPECT_EQ(*DefaultDemoCacheDir(Env({{"XDG_CACHE_HOME", "/c"}, {"HOME", "/home/u"}})),
            "/c/expertd/demo");
  EXPECT_EQ(*DefaultDemoCacheDir(Env({{"HOME", "/home/u"}})), "/home/u/.cache/expertd/demo");
  EXPECT_EQ(DefaultDemoCacheDir(Env({})).status().code(), absl::StatusCode::kFailedPrecondition);
  DemoConfig d;
  d.cache_dir = "/var/cache/expertd";
  EXPECT_EQ(*ResolveDemoCacheDir(d, Env({})), "/var/cache/expertd");
}

TEST(ConfigEnvironment, FromProcessCapturesVariables) {
  // Single-threaded test process: setenv is safe here.
  ASSERT_EQ(setenv("EXPERTD_CONFIG_TEST_VAR", "a=b", 1), 0);  // NOLINT(concurrency-mt-unsafe)
  const Environment env = Environment::FromProcess();
  EXPECT_EQ(env.Get("EXPERTD_CONFIG_TEST_VAR"), "a=b");
  EXPECT_EQ(env.Get("EXPERTD_CONFIG_TEST_UNSET"), "");
  unsetenv("EXPERTD_CONFIG_TEST_VAR");  // NOLINT(concurrency-mt-unsafe)
}

// ---- TCP ----

TEST(ConfigTcp, TokenRules) {
  const auto tcp = [](std::string_view rest) { return absl::StrCat("[listen]\n", AV(rest), "\n"); };
  EXPECT_TRUE(Parse(tcp("tcp = \"0.0.0.0:7070\"\ntcp_token_file = \"/etc/expertd/token\"")).ok());
  EXPECT_TRUE(Parse(tcp("tcp = \"[::]:7070\"\ntcp_token_file = \"/t\"")).ok());
  for (std::string_view host : {"127.0.0.1:7070", "[::1]:7070", "localhost:7070"}) {
    absl::StatusOr<DaemonConfig> c =
        Parse(tcp(absl::StrCat("tcp = \"", AV(host), "\"\ntcp_allow_unauthenticated = true")));
    EXPECT_TRUE(c.ok()) << host << ": " << c.status();
  }
  EXPECT_TRUE(Bad(tcp("tcp = \"127.0.0.1:7070\""),
                  {"cfg.toml:2:", "listen.tcp: a TCP listener needs listen.tcp_token_file"}));
  EXPECT_TRUE(Bad(tcp("tcp = \"0.0.0.0:7070\"\ntcp_allow_unauthenticated = true"),
                  {"listen.tcp: host \"0.0.0.0\" is not loopback"}));
  EXPECT_TRUE(Bad(tcp("tcp = \"10.0.0.5:7070\"\ntcp_allow_unauthenticated = true"),
                  {"listen.tcp: host \"10.0.0.5\" is not loopback"}));
  EXPECT_TRUE(Bad(tcp("tcp = \"127.0.0.1:7070\"\ntcp_token_file = \"/t\"\n"
                      "tcp_allow_unauthenticated = true"),
                  {"cfg.toml:4:", "listen.tcp_allow_unauthenticated: cannot be true together"}));
  // Without tcp, the other two keys are inert.
  EXPECT_TRUE(Parse(tcp("tcp_allow_unauthenticated = true")).ok());
}

TEST(ConfigTcp, HostPortSyntax) {
  EXPECT_EQ(*ParseHostPort("127.0.0.1:80"), (HostPort{"127.0.0.1", 80}));
  EXPECT_EQ(*ParseHostPort("[::1]:9100"), (HostPort{"::1", 9100}));
  EXPECT_EQ(*ParseHostPort("example.org:0"), (HostPort{"example.org", 0}));
  EXPECT_EQ(FormatHostPort(HostPort{"::1", 9100}), "[::1]:9100");
  EXPECT_EQ(FormatHostPort(HostPort{"localhost", 1}), "localhost:1");
  for (std::string_view bad : {"localhost", ":80", "::1:80", "[::1]", "[::1]80", "[::1:80",
                               "h:65536", "h:-1", "h:8o", "h:", "[h]:80", "a b:80"}) {
    EXPECT_FALSE(ParseHostPort(bad).ok()) << bad;
  }
  EXPECT_TRUE(Bad("[metrics]\nlisten = \"9100\"\n", {"metrics.listen: expected \"HOST:PORT\""}));
  absl::StatusOr<DaemonConfig> c = Parse("[metrics]\nlisten = \"127.0.0.1:9100\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics.listen, (HostPort{"127.0.0.1", 9100}));
}

// ---- SIGHUP ----

TEST(ConfigReload, AppliesOnlyReloadableKeys) {
  DaemonConfig live = DefaultConfig();
  absl::StatusOr<DaemonConfig> fresh = Parse(
      "[logging]\nlevel = \"debug\"\n[cache]\npolicy = \"lru\"\n"
      "[predictor]\nkind = \"none\"\nlookahead = 2\nmax_experts = 3\nhistory_tokens = 5\n");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(ApplyReloadable(*fresh, live).ok());
  EXPECT_EQ(live, *fresh);

  absl::StatusOr<DaemonConfig> mixed =
      Parse("[logging]\nlevel = \"warn\"\n[device]\nslot_memory = \"2GiB\"\n");
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  const absl::Status s = ApplyReloadable(*mixed, live);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(s.message()).find("device.slot_memory"), std::string::npos) << s;
  EXPECT_EQ(std::string(s.message()).find("logging.level"), std::string::npos) << s;
  EXPECT_EQ(live.logging.level, LoggingConfig::Level::kWarn);  // applied anyway
  EXPECT_EQ(live.device.slot_memory, uint64_t{1} << 30);       // kept
  EXPECT_EQ(live.cache.policy, CacheConfig::Policy::kCycle);   // fresh file's value
}

TEST(ConfigReload, EveryOtherKeyNeedsARestartAndIsNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"listen.unix_socket", "[listen]\nunix_socket = \"/x.sock\""},
      {"listen.socket_mode", "[listen]\nsocket_mode = \"0600\""},
      {"listen.directory_mode", "[listen]\ndirectory_mode = \"0700\""},
      {"listen.allowed_uids", "[listen]\nallowed_uids = [5]"},
      {"listen.allowed_gids", "[listen]\nallowed_gids = [5]"},
      {"listen.tcp", "[listen]\ntcp = \"h:1\"\ntcp_token_file = \"/t\""},
      {"listen.tcp_token_file", "[listen]\ntcp_token_file = \"/t\""},
      {"listen.tcp_allow_unauthenticated", "[listen]\ntcp_allow_unauthenticated = true"},
      {"model", "[[model]]\nname = \"a\"\ngguf = \"/a\""},
      {"device.kind", "[device]\nkind = \"cuda\""},
      {"device.cuda_devices", "[device]\ncuda_devices = [1]"},
      {"device.slot_memory", "[device]\nslot_memory = \"2GiB\""},
      {"device.staging_memory", "[device]\nstaging_memory = \"1MiB\""},
      {"device.copy_streams", "[device]\ncopy_streams = 3"},
      {"device.cuda_ipc_event_limit", "[device]\ncuda_ipc_event_limit = 100"},
      {"readers.method", "[readers]\nmethod = \"mmap\""},
      {"readers.threads_per_group", "[readers]\nthreads_per_group = 3"},
      {"readers.max_eio_retries", "[readers]\nmax_eio_retries = 0"},
      {"limits.max_sessions", "[limits]\nmax_sessions = 1"},
      {"limits.max_leases_per_session", "[limits]\nmax_leases_per_session = 1"},
      {"limits.max_experts_per_acquire", "[limits]\nmax_experts_per_acquire = 1"},
      {"limits.max_slots_per_session", "[limits]\nmax_slots_per_session = 5"},
      {"limits.lease_ttl", "[limits]\nlease_ttl = \"1s\""},
      {"limits.session_attach_timeout", "[limits]\nsession_attach_timeout = \"1s\""},
      {"limits.max_message_bytes", "[limits]\nmax_message_bytes = \"1MiB\""},
      {"limits.drain_timeout", "[limits]\ndrain_timeout = \"1s\""},
      {"logging.format", "[logging]\nformat = \"json\""},
      {"metrics.listen", "[metrics]\nlisten = \"127.0.0.1:9100\""},
      {"demo.cache_dir", "[demo]\ncache_dir = \"/c\""},
      {"demo.preset", "[demo]\npreset = \"other\""},
  };
  for (const auto& [key, text] : cases) {
    absl::StatusOr<DaemonConfig> fresh = Parse(text);
    ASSERT_TRUE(fresh.ok()) << text << ": " << fresh.status();
    DaemonConfig live = DefaultConfig();
    const absl::Status s = ApplyReloadable(*fresh, live);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << key;
    EXPECT_NE(std::string(s.message()).find(key), std::string::npos) << key << ": " << s;
    EXPECT_EQ(live, DefaultConfig()) << key;
  }
}

TEST(ConfigDescribe, OneLineSummary) {
  absl::StatusOr<DaemonConfig> c = Parse(
      "[listen]\ntcp = \"127.0.0.1:7070\"\ntcp_allow_unauthenticated = true\n"
      "[[model]]\nname = \"mix\"\ngguf = \"/m.gguf\"\n[device]\nkind = \"host\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string line = DescribeConfig(*c);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  for (std::string_view part : {"models=[mix]", "device=host", "slots=1GiB", "staging=64MiB",
                                "readers=pread threads_per_group=2", "cache=cycle",
                                "predictor=history lookahead=4 max_experts=12",
                                "tcp=127.0.0.1:7070(no token)", "metrics=off", "log=info/text"}) {
    EXPECT_NE(line.find(part), std::string::npos) << part << " in " << line;
  }
}

}  // namespace
}  // namespace expertd
