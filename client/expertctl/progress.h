// Progress output for long copies: a redrawn bar with bytes and rate on a terminal, plain lines
// (every 10% or 5 s, after the first 2 s) otherwise, so logs stay readable. Writes to stderr; `quiet` silences it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace expertd::ctl {

class Progress {
 public:
  // `unit` empty: amounts are bytes (shown as KiB/MiB, with a rate); otherwise plain counts of
  // `unit` ("records").
  Progress(std::string label, uint64_t total_bytes, bool quiet = false, std::string unit = {});
  ~Progress();
  void Update(uint64_t done_bytes);
  // Prints the final line (total and average rate). Called by the destructor if not before.
  void Finish();
  double seconds() const;

 private:
  void Draw(uint64_t done, bool final);
  std::string label_;
  std::string unit_;
  uint64_t total_;
  bool quiet_;
  bool tty_;
  bool finished_ = false;
  uint64_t done_ = 0;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1.5 GiB", "12.0 MiB", "512 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace expertd::ctl
