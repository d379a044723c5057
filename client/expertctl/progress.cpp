#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace expertd::ctl {

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

Progress::Progress(std::string label, uint64_t total_bytes, bool quiet, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total_bytes),
      quiet_(quiet),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { Finish(); }

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::Update(uint64_t done_bytes) {
  done_ = done_bytes;
  if (quiet_ || done_bytes >= total_) return;  // the final line is Finish()'s
  const auto now = std::chrono::steady_clock::now();
  const int decile = total_ == 0 ? 10 : static_cast<int>(done_bytes * 10 / total_);
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  } else if (now - start_ < std::chrono::seconds(2) ||
             (decile == last_decile_ && now - last_draw_ < std::chrono::seconds(5))) {
    return;  // short work gets only its final line in logs
  }
  last_decile_ = decile;
  last_draw_ = now;
  Draw(done_bytes, false);
}

void Progress::Finish() {
  if (finished_) return;
  finished_ = true;
  if (!quiet_) Draw(done_, true);
}

void Progress::Draw(uint64_t done, bool final) {
  const double s = seconds();
  const double rate = s > 0 ? static_cast<double>(done) / s : 0;
  const double frac = total_ == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total_);
  const auto amount = [&](uint64_t v) {
    return unit_.empty() ? HumanBytes(v) : std::to_string(v) + " " + unit_;
  };
  const std::string rate_text =
      unit_.empty() ? HumanBytes(static_cast<uint64_t>(rate)) + "/s"
                    : std::to_string(static_cast<uint64_t>(rate)) + " " + unit_ + "/s";
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r%s [%s] %5.1f%% %s / %s  %s%s", label_.c_str(), bar.c_str(),
                 frac * 100, amount(done).c_str(), amount(total_).c_str(),
                 rate_text.c_str(), final ? "\n" : "   ");
  } else {
    std::fprintf(stderr, "%s: %.0f%% %s of %s, %s%s\n", label_.c_str(), frac * 100,
                 amount(done).c_str(), amount(total_).c_str(), rate_text.c_str(),
                 final ? " (done)" : "");
  }
  std::fflush(stderr);
}

}  // namespace expertd::ctl
