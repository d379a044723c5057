#include "lifecycle.h"

#include <systemd/sd-daemon.h>
#include <time.h>

#include <cstdio>
#include <mutex>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace expertd {
namespace {

spdlog::level::level_enum ToSpdlog(LoggingConfig::Level level) {
  switch (level) {
    case LoggingConfig::Level::kTrace: return spdlog::level::trace;
    case LoggingConfig::Level::kDebug: return spdlog::level::debug;
    case LoggingConfig::Level::kInfo: return spdlog::level::info;
    case LoggingConfig::Level::kWarn: return spdlog::level::warn;
    case LoggingConfig::Level::kError: return spdlog::level::err;
    case LoggingConfig::Level::kOff: return spdlog::level::off;
  }
  return spdlog::level::info;
}

// One JSON object per line: {"ts":"...","level":"info","msg":"..."} with the message escaped,
// for log shippers.
class JsonLineSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const auto t = std::chrono::system_clock::to_time_t(msg.time);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        msg.time.time_since_epoch()).count() % 1000;
    std::tm tm{};
    gmtime_r(&t, &tm);
    char ts[80];
    std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(ms));
    std::string line = "{\"ts\":\"";
    line += ts;
    line += "\",\"level\":\"";
    const auto level = spdlog::level::to_string_view(msg.level);
    line.append(level.data(), level.size());
    line += "\",\"msg\":\"";
    for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      switch (c) {
        case '"': line += "\\\""; break;
        case '\\': line += "\\\\"; break;
        case '\n': line += "\\n"; break;
        case '\t': line += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\u%04x", c);
            line += esc;
          } else {
            line += c;
          }
      }
    }
    line += "\"}\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  void flush_() override { std::fflush(stderr); }
};

}  // namespace

void SetUpLogging(const LoggingConfig& logging) {
  std::shared_ptr<spdlog::logger> logger;
  if (logging.format == LoggingConfig::Format::kJson) {
    logger = std::make_shared<spdlog::logger>("expertd", std::make_shared<JsonLineSink>());
  } else {
    logger = std::make_shared<spdlog::logger>(
        "expertd", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  }
  logger->set_level(ToSpdlog(logging.level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

void SetLogLevel(LoggingConfig::Level level) { spdlog::set_level(ToSpdlog(level)); }

ServiceManager::ServiceManager() : watchdog_interval_(absl::ZeroDuration()) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
    watchdog_interval_ = absl::Microseconds(static_cast<int64_t>(usec / 2));
  }
}

ServiceManager::~ServiceManager() {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
}

void ServiceManager::Notify(const std::string& message) {
  // Returns 0 when $NOTIFY_SOCKET is unset: not under systemd, nothing to do.
  const int r = sd_notify(0, message.c_str());
  if (r < 0) spdlog::warn("sd_notify: {}", std::strerror(-r));
}

void ServiceManager::Status(std::string_view text) {
  spdlog::info("{}", text);
  Notify("STATUS=" + std::string(text));
}

void ServiceManager::Ready(std::string_view status) {
  spdlog::info("{}", status);
  Notify("READY=1\nSTATUS=" + std::string(status));
}

void ServiceManager::Stopping(std::string_view status) {
  spdlog::info("{}", status);
  Notify("STOPPING=1\nSTATUS=" + std::string(status));
}

void ServiceManager::Reloading() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const uint64_t usec = uint64_t(ts.tv_sec) * 1000000 + uint64_t(ts.tv_nsec) / 1000;
  Notify("RELOADING=1\nMONOTONIC_USEC=" + std::to_string(usec));
}

void ServiceManager::ReloadDone() { Notify("READY=1"); }

void ServiceManager::StartWatchdog(std::atomic<bool>* healthy) {
  if (!watchdog_enabled()) return;
  spdlog::info("watchdog: pinging every {}", absl::FormatDuration(watchdog_interval_));
  watchdog_ = std::thread([this, healthy] {
    const absl::Duration step = absl::Milliseconds(50);
    absl::Time next = absl::Now();
    while (!stop_.load()) {
      if (absl::Now() >= next) {
        if (healthy->load()) Notify("WATCHDOG=1");
        next = absl::Now() + watchdog_interval_;
      }
      absl::SleepFor(step);
    }
  });
}

void BlockServiceSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForSignal(absl::Duration timeout) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  const timespec ts = absl::ToTimespec(timeout);
  const int sig = sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

}  // namespace expertd
