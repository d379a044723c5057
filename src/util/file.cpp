#include "util/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace expertd {

absl::StatusOr<ReadFile> ReadFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(ErrorKind::kMissingFile, absl::StrCat("cannot open ", path), errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(ErrorKind::kIo, absl::StrCat("cannot stat ", path), err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidError(ErrorKind::kMissingFile, absl::StrCat(path, ": not a regular file"));
  }
  return ReadFile(path, fd, static_cast<uint64_t>(st.st_size));
}

ReadFile::ReadFile(std::string path, int fd, uint64_t size)
    : path_(std::move(path)), fd_(fd), size_(size) {}

ReadFile::ReadFile(ReadFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

ReadFile& ReadFile::operator=(ReadFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

ReadFile::~ReadFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ReadFile::ReadAt(uint64_t offset, std::span<uint8_t> out) const {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done,
                              static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(ErrorKind::kIo, absl::StrCat("read ", path_, " at byte ", offset + done),
                        errno);
    }
    if (n == 0) {
      return DataError(ErrorKind::kTruncated,
                       absl::StrCat(path_, ": unexpected end of file at byte ", offset + done,
                                    " (wanted ", out.size(), " bytes at ", offset, ")"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<WriteFile> WriteFile::Create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(ErrorKind::kIo, absl::StrCat("cannot create ", path), errno);
  return WriteFile(path, fd);
}

WriteFile::WriteFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

WriteFile::WriteFile(WriteFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      written_(other.written_) {}

WriteFile& WriteFile::operator=(WriteFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    written_ = other.written_;
  }
  return *this;
}

WriteFile::~WriteFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status WriteFile::WriteAt(uint64_t offset, std::span<const uint8_t> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                               static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(ErrorKind::kIo, absl::StrCat("write ", path_, " at byte ", offset + done),
                        errno);
    }
    done += static_cast<size_t>(n);
  }
  if (offset + bytes.size() > written_) written_ = offset + bytes.size();
  return absl::OkStatus();
}

absl::Status WriteFile::Append(std::span<const uint8_t> bytes) { return WriteAt(written_, bytes); }

absl::Status WriteFile::Close() {
  if (fd_ < 0) return absl::OkStatus();
  const int fd = std::exchange(fd_, -1);
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(ErrorKind::kIo, absl::StrCat("fsync ", path_), err);
  }
  if (::close(fd) != 0) return ErrnoError(ErrorKind::kIo, absl::StrCat("close ", path_), errno);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, std::string_view what) {
  absl::StatusOr<ReadFile> file = ReadFile::Open(path);
  if (!file.ok()) {
    return MakeError(file.status().code(), ErrorKind::kMissingFile,
                     absl::StrCat(path, ": cannot read ", AV(what), ": ", file.status().message()));
  }
  std::string text(file->size(), '\0');
  const absl::Status read =
      file->ReadAt(0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(text.data()), text.size()));
  if (!read.ok()) {
    return MakeError(read.code(), ErrorKindOf(read).value_or(ErrorKind::kIo),
                     absl::StrCat(path, ": cannot read ", AV(what), ": ", read.message()));
  }
  return text;
}

absl::Status WriteTextFileAtomic(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  {
    absl::StatusOr<WriteFile> file = WriteFile::Create(tmp);
    if (!file.ok()) return file.status();
    RETURN_IF_ERROR(file->Append(
        std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size())));
    RETURN_IF_ERROR(file->Close());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoError(ErrorKind::kIo, absl::StrCat("rename ", tmp, " to ", path), errno);
  }
  return absl::OkStatus();
}

}  // namespace expertd
