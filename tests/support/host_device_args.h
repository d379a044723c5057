// The host device's descriptors as command-line arguments, and the byte pattern of device_test,
// shared by the test and its second process (host_device_child.cpp).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "device/device.h"

namespace expertd::testing {

inline uint8_t Pattern(uint32_t seed, uint64_t i) {
  return static_cast<uint8_t>(uint64_t{seed} * 31 + i * 7 + (i >> 8) + 1);
}

// NAME (- for none) FD OWNER_PID DEV INODE.
inline void AppendHandle(std::vector<std::string>& args, const SharedHandle& h) {
  args.push_back(h.shm_name.empty() ? "-" : h.shm_name);
  args.push_back(absl::StrCat(h.fd));
  args.push_back(absl::StrCat(h.owner_pid));
  args.push_back(absl::StrCat(h.dev));
  args.push_back(absl::StrCat(h.inode));
}

inline SharedHandle ParseHandle(char** argv) {
  SharedHandle h;
  h.kind = SharedHandle::Kind::kHostShm;
  h.shm_name = std::string(argv[0]) == "-" ? "" : argv[0];
  h.fd = std::atoi(argv[1]);
  h.owner_pid = std::strtoll(argv[2], nullptr, 10);
  h.dev = std::strtoull(argv[3], nullptr, 10);
  h.inode = std::strtoull(argv[4], nullptr, 10);
  return h;
}

}  // namespace expertd::testing
