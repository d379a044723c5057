// Helpers shared by the pack tests (reader_test.cpp, reader_pool_test.cpp): deterministic pack
// contents, the whole-file read + memcpy oracle, job completion recorders.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "pack/pack_set.h"
#include "pack/reader_pool.h"
#include "support/test_support.h"

namespace expertd::reader_test {

using ::expertd::testing::TempDir;

// Deterministic bytes that differ at every offset (so misplaced bytes are caught).
inline std::string Content(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[i] = static_cast<char>(x >> 24);
  }
  return s;
}

inline std::string MakePack(const TempDir& dir, const std::string& name, size_t size,
                            uint64_t seed) {
  std::string path = dir.File(name);
  ::expertd::testing::WriteFile(path, Content(size, seed));
  return path;
}

// The reference: the whole file read with a plain std::ifstream (no code of the readers), ranges
// copied out with memcpy.
class Oracle {
 public:
  explicit Oracle(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << path;
    bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes_.size(), std::filesystem::file_size(path)) << path;
  }
  std::string Range(uint64_t offset, uint64_t bytes) const {
    std::string out(bytes, '\0');
    std::memcpy(out.data(), bytes_.data() + offset, bytes);
    return out;
  }
  uint64_t size() const { return bytes_.size(); }

 private:
  std::vector<char> bytes_;
};

inline std::string AsString(const uint8_t* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n);
}

// A one-shot event on std primitives (ThreadSanitizer cannot see Debian's absl::Mutex).
class Notification {
 public:
  void Notify() {
    std::lock_guard lock(mu_);
    notified_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return notified_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool notified_ = false;
};

// Collects the outcome of one job.
struct Done {
  std::mutex mu;
  Notification finished;
  absl::Status status;  // guarded by mu
  int calls = 0;        // guarded by mu

  ReadDone Callback() {
    return [this](absl::Status s) {
      {
        std::lock_guard lock(mu);
        status = std::move(s);
        ++calls;
      }
      finished.Notify();
    };
  }
  absl::Status Wait() {
    finished.Wait();
    std::lock_guard lock(mu);
    return status;
  }
  int Calls() {
    std::lock_guard lock(mu);
    return calls;
  }
};

inline PackSpec Spec(std::string path, std::string label, std::string group = "",
                     PackReadHook hook = {}) {
  PackSpec spec;
  spec.path = std::move(path);
  spec.label = std::move(label);
  spec.group = std::move(group);
  spec.test_hook = std::move(hook);
  return spec;
}

inline PackSetOptions WithMethod(ReadMethod method) {
  PackSetOptions o;
  o.method = method;
  return o;
}

}  // namespace expertd::reader_test
