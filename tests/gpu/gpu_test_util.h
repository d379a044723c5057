// Helpers shared by the CUDA GPU tests (tests/gpu): byte patterns, the slot checksum both the
// host and the consumer's kernel compute, hex, a child process with pipes, and check counting.
// No CUDA types: the tests reach the backend through device/cuda_factory.h.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "device/device_probe.h"

namespace expertd::gpu_test {

inline uint8_t PatternByte(uint32_t slot, uint64_t generation, uint64_t i) {
  return static_cast<uint8_t>(slot * 131u + generation * 17u + i * 7u + (i >> 9));
}

inline void FillPattern(std::span<uint8_t> out, uint32_t slot, uint64_t generation) {
  for (uint64_t i = 0; i < out.size(); ++i) out[i] = PatternByte(slot, generation, i);
}

// The slot checksum (also in checksum_kernel.cu): the sum, modulo 2^64, of Mix(word_i, i) over
// the slot's little-endian 64-bit words. Order-sensitive, and parallel on the GPU.
inline uint64_t MixWord(uint64_t w, uint64_t i) {
  uint64_t x = w ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

inline uint64_t SlotChecksum(std::span<const uint8_t> bytes) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < bytes.size() / 8; ++i) {
    uint64_t w = 0;
    std::memcpy(&w, bytes.data() + i * 8, 8);
    sum += MixWord(w, i);
  }
  return sum;
}

inline std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

inline bool Unhex(std::string_view hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    int v = 0;
    for (size_t k = 0; k < 2; ++k) {
      const char c = hex[i + k];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + d;
    }
    out->push_back(static_cast<char>(v));
  }
  return true;
}

// Counts failed checks and prints each with its place.
class Checks {
 public:
  bool Expect(bool ok, const std::string& what) {
    if (!ok) {
      ++failures_;
      std::printf("FAIL: %s\n", what.c_str());
      std::fflush(stdout);
    }
    return ok;
  }
  bool Ok(const absl::Status& st, const std::string& what) {
    return Expect(st.ok(), absl::StrCat(what, ": ", st.ToString()));
  }
  int failures() const { return failures_; }
  int Finish(const std::string& name) const {
    std::printf("%s: %s (%d failure(s))\n", name.c_str(), failures_ == 0 ? "OK" : "FAILED",
                failures_);
    return failures_ == 0 ? 0 : 1;
  }

 private:
  int failures_ = 0;
};

// Exits 77 (ctest: skipped) with the reason when this process cannot use a CUDA GPU.
inline void SkipWithoutGpu() {
  const BuildFeatures features = GetBuildFeatures();
  if (!features.cuda_backend) {
    std::printf("SKIP: built without the CUDA backend\n");
    std::exit(77);
  }
  const DeviceProbe probe = ProbeDevices();
  if (probe.kind != DeviceProbe::Kind::kCuda) {
    std::printf("SKIP: no usable GPU: %s\n", probe.log_line.c_str());
    std::exit(77);
  }
  std::printf("%s\n", probe.log_line.c_str());
}

// A child process whose stdin and stdout are pipes to us.
struct Child {
  pid_t pid = -1;
  FILE* to = nullptr;    // the child's stdin
  FILE* from = nullptr;  // the child's stdout

  // Exits with the child's status (or 128 + signal); -1 when it could not be waited for.
  int Wait() {
    if (to != nullptr) std::fclose(to);
    if (from != nullptr) std::fclose(from);
    to = from = nullptr;
    int status = 0;
    if (pid <= 0 || ::waitpid(pid, &status, 0) != pid) return -1;
    pid = -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  }
};

// fork + execvp right away (CUDA state is not fork-safe; exec discards it). `pipes` false: the
// child inherits our stdin/stdout.
inline absl::Status Spawn(const std::vector<std::string>& argv, bool pipes, Child* child) {
  int in[2] = {-1, -1};
  int out[2] = {-1, -1};
  if (pipes && (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    if (pipes) {
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  child->pid = pid;
  if (pipes) {
    ::close(in[0]);
    ::close(out[1]);
    child->to = ::fdopen(in[1], "w");
    child->from = ::fdopen(out[0], "r");
  }
  return absl::OkStatus();
}

// One line from `f` without its newline; false at end of file.
inline bool ReadLine(FILE* f, std::string* line) {
  line->clear();
  int c;
  while ((c = std::fgetc(f)) != EOF && c != '\n') line->push_back(static_cast<char>(c));
  return c != EOF || !line->empty();
}

// The directory of the running executable (to find sibling executables of a bundle).
inline std::string SelfDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace expertd::gpu_test
