#include "util/file.h"

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace expertd {

absl::StatusOr<ReadFile> ReadFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(OsFile file, OsFile::Open(path, OsFile::Access::kRead));
  absl::StatusOr<FileInfo> info = file.Info();
  if (!info.ok()) {
    return MakeError(info.status().code(), ErrorKind::kIo,
                     absl::StrCat("cannot stat ", path, ": ", info.status().message()));
  }
  if (!info->regular) {
    return InvalidError(ErrorKind::kMissingFile, absl::StrCat(path, ": not a regular file"));
  }
  return ReadFile(path, std::move(file), info->size);
}

ReadFile::ReadFile(std::string path, OsFile file, uint64_t size)
    : path_(std::move(path)), file_(std::move(file)), size_(size) {}

absl::Status ReadFile::ReadAt(uint64_t offset, std::span<uint8_t> out) const {
  size_t done = 0;
  while (done < out.size()) {
    int err = 0;
    const int64_t n = file_.ReadAt(offset + done, out.data() + done, out.size() - done, &err);
    if (n < 0) {
      if (err == EINTR) continue;
      return ErrnoError(ErrorKind::kIo, absl::StrCat("read ", path_, " at byte ", offset + done),
                        err);
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
  ASSIGN_OR_RETURN(OsFile file, OsFile::Open(path, OsFile::Access::kWrite));
  return WriteFile(path, std::move(file));
}

WriteFile::WriteFile(std::string path, OsFile file)
    : path_(std::move(path)), file_(std::move(file)) {}

absl::Status WriteFile::WriteAt(uint64_t offset, std::span<const uint8_t> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    int err = 0;
    const int64_t n = file_.WriteAt(offset + done, bytes.data() + done, bytes.size() - done, &err);
    if (n < 0) {
      if (err == EINTR) continue;
      return ErrnoError(ErrorKind::kIo, absl::StrCat("write ", path_, " at byte ", offset + done),
                        err);
    }
    done += static_cast<size_t>(n);
  }
  if (offset + bytes.size() > written_) written_ = offset + bytes.size();
  return absl::OkStatus();
}

absl::Status WriteFile::Append(std::span<const uint8_t> bytes) { return WriteAt(written_, bytes); }

absl::Status WriteFile::Close() {
  if (!file_.valid()) return absl::OkStatus();
  const int sync = file_.Sync();
  if (sync != 0 && sync != EINVAL) {
    file_.Close();
    return ErrnoError(ErrorKind::kIo, absl::StrCat("fsync ", path_), sync);
  }
  if (const int err = file_.Close(); err != 0) {
    return ErrnoError(ErrorKind::kIo, absl::StrCat("close ", path_), err);
  }
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
    RETURN_IF_ERROR(
        file->Append(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size())));
    RETURN_IF_ERROR(file->Close());
  }
  return RenameReplacing(tmp, path);
}

}  // namespace expertd
