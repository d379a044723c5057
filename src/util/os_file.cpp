// The platform-free part of util/os_file.h; the rest is in os_file_posix.cpp / os_file_win32.cpp.
#include "util/os_file.h"

#include <utility>

namespace expertd {

FileMapping::FileMapping(FileMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      kind_(other.kind_) {}

FileMapping& FileMapping::operator=(FileMapping&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    kind_ = other.kind_;
  }
  return *this;
}

FileMapping::~FileMapping() { Reset(); }

}  // namespace expertd
