#include "pack/pack_set.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "util/checked.h"
#include "util/hash.h"
#include "util/os_file.h"
#include "util/status.h"

namespace expertd {
namespace {

// Linux transfers at most 0x7ffff000 bytes per read call; keep each attempt below that.
constexpr uint64_t kMaxAttemptBytes = 1ull << 30;
// EAGAIN on a regular file is rare (RWF_NOWAIT, some network filesystems): back off briefly, but
// never spin forever on it.
constexpr int kMaxAgainRetries = 100;
constexpr auto kAgainBackoff = std::chrono::microseconds(100);
// Short O_DIRECT reads that end before the wanted bytes while the file is still long enough.
constexpr int kMaxStalls = 8;

uint64_t AlignDown(uint64_t v, uint64_t a) { return v & ~(a - 1); }
uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

}  // namespace

class OpenPack {
 public:
  std::string Name() const { return absl::StrCat("pack ", entry.label, " (", entry.path, ")"); }

  PackEntry entry;
  // The file as opened: what CheckFiles compares the path with, and what Reopen must find.
  FileIdentity id;
  uint64_t fingerprint = 0;
  OsFile file;          // buffered: positional reads, the size, and the mapping's size check
  OsFile direct;        // unbuffered (method kDirect)
  FileMapping mapping;  // whole-file mapping (method kMmap, non-empty file)
  PackReadHook hook;

  mutable std::atomic<uint64_t> bytes_read{0};
  mutable std::atomic<uint64_t> reads{0};
  mutable std::atomic<uint64_t> syscalls{0};
  mutable std::atomic<uint64_t> retries{0};
  mutable std::atomic<uint64_t> errors{0};
  mutable std::atomic<bool> failed{false};
  // std::mutex rather than absl::Mutex: Debian's Abseil is not built for ThreadSanitizer, which
  // then cannot see absl::Mutex synchronization and reports false races.
  mutable std::mutex mu;
  mutable absl::Status failure;  // guarded by mu
};

namespace {

void MarkFailed(const OpenPack& p, absl::Status why) {
  std::lock_guard lock(p.mu);
  if (p.failed.load(std::memory_order_relaxed)) return;
  p.failure = std::move(why);
  p.failed.store(true, std::memory_order_release);
}

absl::Status TruncatedError(const OpenPack& p, uint64_t at, uint64_t offset, uint64_t bytes) {
  return DataError(ErrorKind::kTruncated,
                   absl::StrCat(p.Name(), ": unexpected end of file at byte ", at, " (reading ",
                                bytes, " bytes at byte ", offset, "; the pack had ", p.entry.size,
                                " bytes at open: truncated since?)"));
}

// One primitive read attempt: `op(&err)` returns bytes, or -1 with an errno value in err. The test
// hook may replace the result with an error or shorten it. Returns (bytes, 0) or (-1, errno).
struct AttemptResult {
  int64_t n = -1;
  int err = 0;
};

template <typename Op>
AttemptResult AttemptOnce(const OpenPack& p, uint64_t offset, uint64_t bytes, Op& op) {
  p.syscalls.fetch_add(1, std::memory_order_relaxed);
  int64_t limit = INT64_MAX;
  if (p.hook) [[unlikely]] {
    limit = p.hook(offset, bytes);
    if (limit < 0) return {-1, static_cast<int>(-limit)};
  }
  int err = 0;
  const int64_t n = op(&err);
  if (n < 0) return {-1, err};
  return {std::min(n, limit), 0};
}

// AttemptOnce with the retry policy. Returns the bytes read (0 = end of file) or the error.
template <typename Op>
absl::StatusOr<uint64_t> Attempt(const OpenPack& p, const PackSetOptions& options, uint64_t offset,
                                 uint64_t bytes, Op&& op) {
  uint32_t eio = 0;
  int again = 0;
  for (;;) {
    const AttemptResult r = AttemptOnce(p, offset, bytes, op);
    if (r.err == 0) return static_cast<uint64_t>(r.n);
    if (r.err == EINTR || (r.err == EAGAIN && ++again <= kMaxAgainRetries)) {
      p.retries.fetch_add(1, std::memory_order_relaxed);
      if (r.err == EAGAIN) std::this_thread::sleep_for(kAgainBackoff);
      continue;
    }
    const std::string what = absl::StrCat(p.Name(), ": read of ", bytes, " bytes at byte ", offset);
    if (r.err != EIO) return ErrnoError(ErrorKind::kIo, what, r.err);
    if (++eio <= options.max_eio_retries) {
      p.retries.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    absl::Status failed = ErrnoError(
        ErrorKind::kIo, absl::StrCat(what, " failed ", eio, " times, pack marked failed"), r.err);
    MarkFailed(p, failed);
    return failed;
  }
}

absl::Status ReadPread(const OpenPack& p, const PackSetOptions& options, uint64_t offset,
                       std::span<uint8_t> out) {
  uint64_t done = 0;
  while (done < out.size()) {
    const uint64_t pos = offset + done;
    const uint64_t want = std::min<uint64_t>(out.size() - done, kMaxAttemptBytes);
    uint8_t* dst = out.data() + done;
    ASSIGN_OR_RETURN(const uint64_t n, Attempt(p, options, pos, want, [&](int* err) {
                       return p.file.ReadAt(pos, dst, want, err);
                     }));
    if (n == 0) return TruncatedError(p, pos, offset, out.size());
    done += n;
  }
  return absl::OkStatus();
}

// O_DIRECT: file offset and length must be multiples of dio_offset_align and the buffer address a
// multiple of dio_mem_align. Where the destination happens to be aligned like the file position,
// whole aligned blocks go straight into it; everything else is widened to aligned bounds, read
// into the bounce buffer and the requested bytes copied out.
absl::Status ReadDirect(const OpenPack& p, const PackSetOptions& options, uint64_t offset,
                        std::span<uint8_t> out, ReadScratch& scratch) {
  const uint64_t a = p.entry.dio_offset_align;
  const uint64_t m = p.entry.dio_mem_align;
  const uint64_t chunk = std::max(a, AlignUp(options.direct_chunk_bytes, a));
  const uint64_t end = offset + out.size();
  uint64_t pos = offset;
  int stalls = 0;
  while (pos < end) {
    uint8_t* dst = out.data() + (pos - offset);
    const uint64_t remaining = end - pos;
    if (pos % a == 0 && reinterpret_cast<uintptr_t>(dst) % m == 0 && remaining >= a) {
      const uint64_t want = std::min(AlignDown(remaining, a), AlignDown(kMaxAttemptBytes, a));
      ASSIGN_OR_RETURN(const uint64_t n, Attempt(p, options, pos, want, [&](int* err) {
                         return p.direct.ReadAt(pos, dst, want, err);
                       }));
      if (n == 0) return TruncatedError(p, pos, offset, out.size());
      pos += std::min(n, want);
      continue;
    }
    const uint64_t start = AlignDown(pos, a);
    const uint64_t stop = std::min(AlignUp(end, a), start + chunk);
    uint8_t* bounce = scratch.Get(stop - start, m);
    if (bounce == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat(p.Name(), ": no memory for a ", stop - start, "-byte bounce buffer"));
    }
    ASSIGN_OR_RETURN(const uint64_t n, Attempt(p, options, start, stop - start, [&](int* err) {
                       return p.direct.ReadAt(start, bounce, stop - start, err);
                     }));
    if (start + n <= pos) {
      // Nothing new: the block before `pos` came back short. That is the end of the file when the
      // file no longer reaches `pos`; otherwise (an interrupted transfer) try again, boundedly.
      int size_err = 0;
      const int64_t now = p.file.Size(&size_err);
      if (n == 0 || (now >= 0 && static_cast<uint64_t>(now) <= pos) || ++stalls > kMaxStalls) {
        return TruncatedError(p, pos, offset, out.size());
      }
      continue;
    }
    stalls = 0;
    const uint64_t got = std::min(start + n, end) - pos;
    std::memcpy(dst, bounce + (pos - start), got);
    pos += got;
  }
  return absl::OkStatus();
}

// A mapped file that shrinks raises SIGBUS on access to pages past its new end (Windows refuses
// to shrink a mapped file). The size is
// checked right before each copy, which catches truncation that happened earlier; truncation
// racing with the copy itself remains a risk (docs/readers.md).
absl::Status ReadMapped(const OpenPack& p, const PackSetOptions& options, uint64_t offset,
                        std::span<uint8_t> out) {
  uint64_t done = 0;
  while (done < out.size()) {
    const uint64_t pos = offset + done;
    const uint64_t want = out.size() - done;
    uint8_t* dst = out.data() + done;
    ASSIGN_OR_RETURN(const uint64_t n, Attempt(p, options, pos, want, [&](int* err) -> int64_t {
                       const int64_t size = p.file.Size(err);
                       if (size < 0) return -1;
                       const auto now = static_cast<uint64_t>(size);
                       if (now <= pos) return 0;
                       const uint64_t k = std::min(want, now - pos);
                       std::memcpy(dst, p.mapping.data() + pos, k);
                       return static_cast<int64_t>(k);
                     }));
    if (n == 0) return TruncatedError(p, pos, offset, out.size());
    done += n;
  }
  return absl::OkStatus();
}

// Sets up O_DIRECT for `p`; returns a non-empty reason when the pack must fall back to pread.
absl::StatusOr<std::string> SetUpDirect(OpenPack& p, const FileInfo& info) {
  const DirectAlignment dio = p.file.QueryDirectAlignment();
  uint64_t mem = 4096;
  uint64_t off = std::max<uint64_t>(4096, info.block_size);
  if (dio.known) {
    if (dio.offset == 0 || dio.mem == 0) return std::string("statx: no direct I/O on this file");
    mem = dio.mem;
    off = dio.offset;
  }
  if (!IsPowerOfTwo(mem) || !IsPowerOfTwo(off)) {
    return absl::StrCat("unusable direct I/O alignment ", mem, "/", off);
  }
  int err = 0;
  absl::StatusOr<OsFile> direct = OsFile::Open(p.entry.path, OsFile::Access::kReadDirect, &err);
  if (!direct.ok()) {
    if (err == EINVAL) return std::string("open with O_DIRECT: EINVAL");
    return ErrnoError(ErrorKind::kIo, absl::StrCat(p.Name(), ": open with O_DIRECT"), err);
  }
  p.direct = *std::move(direct);
  p.entry.dio_mem_align = static_cast<uint32_t>(mem);
  p.entry.dio_offset_align = static_cast<uint32_t>(off);
  if (p.entry.size == 0) return std::string();
  // Some filesystems accept the flag at open and refuse the reads (EINVAL): probe one block.
  ReadScratch probe;
  uint8_t* buf = probe.Get(off, mem);
  if (buf == nullptr) return absl::ResourceExhaustedError("no memory for the O_DIRECT probe");
  auto op = [&](int* read_err) { return p.direct.ReadAt(0, buf, off, read_err); };
  const AttemptResult r = AttemptOnce(p, 0, off, op);
  if (r.err == EINVAL) {
    p.direct.Close();
    return std::string("O_DIRECT read: EINVAL");
  }
  if (r.err != 0) {
    return ErrnoError(ErrorKind::kIo, absl::StrCat(p.Name(), ": O_DIRECT probe read at byte 0"),
                      r.err);
  }
  return std::string();
}

// The identity Reopen checks: a hash of the first MiB (the GGUF header and tensor table of a
// model file) and the size.
constexpr uint64_t kFingerprintBytes = uint64_t{1} << 20;

absl::StatusOr<uint64_t> Fingerprint(const OsFile& file, uint64_t size, const std::string& name) {
  std::vector<uint8_t> head(std::min(size, kFingerprintBytes));
  uint64_t done = 0;
  while (done < head.size()) {
    int err = 0;
    const int64_t n = file.ReadAt(done, head.data() + done, head.size() - done, &err);
    if (n < 0 && err == EINTR) continue;
    if (n < 0)
      return ErrnoError(ErrorKind::kIo, absl::StrCat(name, ": read for its fingerprint"), err);
    if (n == 0)
      return DataError(ErrorKind::kTruncated, absl::StrCat(name, ": shorter than its size"));
    done += static_cast<uint64_t>(n);
  }
  return Xxh3(head) ^ (size * 0x9E3779B97F4A7C15ull);
}

}  // namespace

std::string_view ReadMethodName(ReadMethod method) {
  switch (method) {
    case ReadMethod::kPread:
      return "pread";
    case ReadMethod::kDirect:
      return "direct";
    case ReadMethod::kMmap:
      return "mmap";
  }
  return "unknown";
}

absl::StatusOr<ReadMethod> ParseReadMethod(std::string_view name) {
  for (ReadMethod m : {ReadMethod::kPread, ReadMethod::kDirect, ReadMethod::kMmap}) {
    if (name == ReadMethodName(m)) return m;
  }
  return InvalidError(ErrorKind::kBadValue,
                      absl::StrCat("unknown read method '", AV(name), "' (pread, direct, mmap)"));
}

ReadScratch::~ReadScratch() { AlignedFree(data_); }

uint8_t* ReadScratch::Get(uint64_t bytes, uint64_t align) {
  if (data_ != nullptr && bytes <= bytes_ && align <= align_ &&
      reinterpret_cast<uintptr_t>(data_) % align == 0) {
    return data_;
  }
  AlignedFree(data_);
  data_ = nullptr;
  bytes_ = 0;
  const uint64_t size = AlignUp(std::max<uint64_t>(bytes, 1), align);
  void* p = AlignedAlloc(align, size);
  if (p == nullptr) return nullptr;
  data_ = static_cast<uint8_t*>(p);
  bytes_ = size;
  align_ = align;
  return data_;
}

absl::StatusOr<std::unique_ptr<PackSet>> PackSet::Open(std::vector<PackSpec> packs,
                                                       const PackSetOptions& options) {
  std::unique_ptr<PackSet> set(new PackSet(options));
  for (PackSpec& spec : packs) RETURN_IF_ERROR(set->OpenOne(std::move(spec)));
  return set;
}

PackSet::PackSet(const PackSetOptions& options) : options_(options) {}

PackSet::~PackSet() = default;

absl::Status PackSet::OpenOne(PackSpec spec) {
  auto p = std::make_unique<OpenPack>();
  p->entry.path = std::move(spec.path);
  p->entry.label = std::move(spec.label);
  p->hook = std::move(spec.test_hook);
  int err = 0;
  absl::StatusOr<OsFile> file = OsFile::Open(p->entry.path, OsFile::Access::kRead, &err);
  if (!file.ok()) {
    return ErrnoError(ErrorKind::kMissingFile, absl::StrCat(p->Name(), ": cannot open"), err);
  }
  p->file = *std::move(file);
  absl::StatusOr<FileInfo> info = p->file.Info();
  if (!info.ok()) {
    return MakeError(info.status().code(), ErrorKind::kIo,
                     absl::StrCat(p->Name(), ": cannot stat: ", info.status().message()));
  }
  if (!info->regular) {
    return InvalidError(ErrorKind::kMissingFile, absl::StrCat(p->Name(), ": not a regular file"));
  }
  p->entry.size = info->size;
  p->id = info->id;
  ASSIGN_OR_RETURN(p->fingerprint, Fingerprint(p->file, p->entry.size, p->Name()));

  p->entry.requested = spec.method.value_or(options_.method);
  p->entry.method = p->entry.requested;
  if (p->entry.requested == ReadMethod::kDirect) {
    ASSIGN_OR_RETURN(std::string why, SetUpDirect(*p, *info));
    if (!why.empty()) {
      p->entry.method = ReadMethod::kPread;
      p->entry.method_note = std::move(why);
      p->entry.dio_mem_align = p->entry.dio_offset_align = 0;
    }
  } else if (p->entry.requested == ReadMethod::kMmap && p->entry.size > 0) {
    p->mapping = FileMapping::Map(p->file, p->entry.size, FileMapping::Kind::kReadShared, &err);
    if (!p->mapping.valid()) {
      // ENODEV: the filesystem cannot map files, which is a missing feature, not a failure.
      if (err != ENODEV) return ErrnoError(ErrorKind::kIo, absl::StrCat(p->Name(), ": mmap"), err);
      p->entry.method = ReadMethod::kPread;
      p->entry.method_note = "mmap: ENODEV (the filesystem cannot map files)";
    }
  }

  p->syscalls.store(0, std::memory_order_relaxed);  // the O_DIRECT probe is not a pack read

  const std::string group = spec.group.empty() ? info->volume_group : spec.group;
  const auto id = static_cast<PackId>(packs_.size());
  auto it = std::find_if(groups_.begin(), groups_.end(),
                         [&](const SourceGroup& g) { return g.name == group; });
  if (it == groups_.end()) it = groups_.insert(groups_.end(), SourceGroup{group, {}});
  it->packs.push_back(id);
  p->entry.group = static_cast<GroupId>(it - groups_.begin());
  packs_.push_back(std::move(p));
  return absl::OkStatus();
}

const PackEntry& PackSet::pack(PackId id) const { return packs_.at(id)->entry; }

absl::Status PackSet::failure(PackId id) const {
  const OpenPack& p = *packs_.at(id);
  if (!p.failed.load(std::memory_order_acquire)) return absl::OkStatus();
  std::lock_guard lock(p.mu);
  return p.failure;
}

std::vector<PackId> PackSet::CheckFiles() const {
  std::vector<PackId> newly;
  for (PackId id = 0; id < packs_.size(); ++id) {
    const OpenPack& p = *packs_[id];
    if (p.failed.load(std::memory_order_acquire)) continue;
    absl::Status why;
    FileIdentity opened;
    {
      std::lock_guard lock(p.mu);  // Reopen changes it
      opened = p.id;
    }
    int err = 0;
    int size_err = 0;
    const absl::StatusOr<FileInfo> at = StatPath(p.entry.path, &err);
    const int64_t size = at.ok() ? p.file.Size(&size_err) : -1;
    if (!at.ok()) {
      why = ErrnoError(ErrorKind::kMissingFile,
                       absl::StrCat(p.Name(), ": its path no longer names a file"), err);
    } else if (at->id != opened) {
      why = absl::FailedPreconditionError(absl::StrCat(
          p.Name(), ": replaced since it was opened (inode ", at->id.file, ", was ", opened.file,
          "); put the file back and reload (SIGHUP), or restart to serve the new one"));
    } else if (size >= 0 && static_cast<uint64_t>(size) < p.entry.size) {
      why =
          DataError(ErrorKind::kTruncated,
                    absl::StrCat(p.Name(), ": truncated to ", size, " bytes (it had ", p.entry.size,
                                 " at open); put the file back and reload (SIGHUP)"));
    } else if (absl::StatusOr<OsFile> probe =
                   OsFile::Open(p.entry.path, OsFile::Access::kRead, &err);
               !probe.ok()) {
      // FAILED_PRECONDITION, like the other cases: the operator has to act (clients retry
      // UNAVAILABLE, which would only make every acquire wait out its timeout).
      why = MakeError(absl::StatusCode::kFailedPrecondition, ErrorKind::kIo,
                      absl::StrCat(p.Name(), ": can no longer be opened: ", std::strerror(err),
                                   "; make it readable again and reload (SIGHUP)"));
    }
    if (why.ok()) continue;
    MarkFailed(p, why);
    newly.push_back(id);
  }
  return newly;
}

absl::Status PackSet::Reopen(PackId id) {
  OpenPack& p = *packs_.at(id);
  if (!p.failed.load(std::memory_order_acquire)) return absl::OkStatus();
  const auto refuse = [&](std::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat(p.Name(), ": not served again: ", AV(why)));
  };
  int err = 0;
  absl::StatusOr<OsFile> file = OsFile::Open(p.entry.path, OsFile::Access::kRead, &err);
  if (!file.ok()) return refuse(absl::StrCat("cannot open it: ", std::strerror(err)));
  const absl::StatusOr<FileInfo> info = file->Info();
  if (!info.ok() || !info->regular) return refuse("not a regular file");
  if (info->size != p.entry.size) {
    return refuse(absl::StrCat("it has ", info->size, " bytes, the file served had ", p.entry.size,
                               "; restart the daemon to serve another file"));
  }
  absl::StatusOr<uint64_t> fp = Fingerprint(*file, p.entry.size, p.Name());
  if (!fp.ok()) return refuse(std::string(fp.status().message()));
  if (*fp != p.fingerprint) {
    return refuse(
        "its first MiB differs from the file served: another file; restart the "
        "daemon to serve it");
  }
  OsFile direct;
  if (p.direct.valid()) {
    absl::StatusOr<OsFile> opened = OsFile::Open(p.entry.path, OsFile::Access::kReadDirect, &err);
    if (!opened.ok()) return refuse(absl::StrCat("O_DIRECT open: ", std::strerror(err)));
    direct = *std::move(opened);
  }
  if (p.mapping.valid()) {
    if (const int map_err = p.mapping.RemapInPlace(*file); map_err != 0) {
      return refuse(absl::StrCat("mmap: ", std::strerror(map_err)));
    }
  }
  // Readers use the handles concurrently: ReplaceWith swaps the file under them at once.
  int swap_err = p.file.ReplaceWith(*std::move(file));
  if (swap_err == 0 && direct.valid()) swap_err = p.direct.ReplaceWith(std::move(direct));
  if (swap_err != 0) return refuse(absl::StrCat("dup2: ", std::strerror(swap_err)));
  std::lock_guard lock(p.mu);
  p.id = info->id;
  p.failure = absl::OkStatus();
  p.failed.store(false, std::memory_order_release);
  return absl::OkStatus();
}

bool PackSet::failed(PackId id) const {
  return packs_.at(id)->failed.load(std::memory_order_acquire);
}

absl::StatusOr<PrivateMapping> PackSet::MapPrivate(PackId id) const {
  const OpenPack& p = *packs_.at(id);
  if (!p.mapping.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(p.Name(), ": only a pack read with mmap has a mapping to register"));
  }
  int err = 0;
  FileMapping map = FileMapping::Map(p.file, p.entry.size, FileMapping::Kind::kPrivateWrite, &err);
  if (!map.valid()) {
    return ErrnoError(ErrorKind::kIo, absl::StrCat(p.Name(), ": private mmap"), err);
  }
  return PrivateMapping(std::move(map));
}

std::span<const uint8_t> PackSet::mapping(PackId id) const {
  const OpenPack& p = *packs_.at(id);
  if (!p.mapping.valid()) return {};
  return {p.mapping.data(), p.entry.size};
}

PackStats PackSet::stats(PackId id) const {
  const OpenPack& p = *packs_.at(id);
  PackStats s;
  s.bytes_read = p.bytes_read.load(std::memory_order_relaxed);
  s.reads = p.reads.load(std::memory_order_relaxed);
  s.syscalls = p.syscalls.load(std::memory_order_relaxed);
  s.retries = p.retries.load(std::memory_order_relaxed);
  s.errors = p.errors.load(std::memory_order_relaxed);
  s.failed = p.failed.load(std::memory_order_acquire);
  return s;
}

absl::Status PackSet::CheckRange(PackId id, uint64_t offset, uint64_t bytes) const {
  if (id >= packs_.size()) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("pack id ", id, " out of range (", packs_.size(), " packs)"));
  }
  const OpenPack& p = *packs_[id];
  if (!RangeInside(offset, bytes, p.entry.size)) {
    return MakeError(absl::StatusCode::kOutOfRange, ErrorKind::kOutOfBounds,
                     absl::StrCat(p.Name(), ": range of ", bytes, " bytes at byte ", offset,
                                  " lies outside its ", p.entry.size, " bytes"));
  }
  if (p.failed.load(std::memory_order_acquire)) [[unlikely]] {
    std::lock_guard lock(p.mu);
    return p.failure;
  }
  return absl::OkStatus();
}

absl::Status PackSet::Read(PackId id, uint64_t offset, std::span<uint8_t> out,
                           ReadScratch& scratch) const {
  RETURN_IF_ERROR(CheckRange(id, offset, out.size()));
  if (out.empty()) return absl::OkStatus();
  const OpenPack& p = *packs_[id];
  p.reads.fetch_add(1, std::memory_order_relaxed);
  absl::Status st;
  switch (p.entry.method) {
    case ReadMethod::kPread:
      st = ReadPread(p, options_, offset, out);
      break;
    case ReadMethod::kDirect:
      st = ReadDirect(p, options_, offset, out, scratch);
      break;
    case ReadMethod::kMmap:
      st = ReadMapped(p, options_, offset, out);
      break;
  }
  if (st.ok()) {
    p.bytes_read.fetch_add(out.size(), std::memory_order_relaxed);
  } else {
    p.errors.fetch_add(1, std::memory_order_relaxed);
  }
  return st;
}

absl::Status PackSet::Read(PackId id, uint64_t offset, std::span<uint8_t> out) const {
  ReadScratch scratch;
  return Read(id, offset, out, scratch);
}

}  // namespace expertd
