#include "pack/pack_set.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

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

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~UniqueFd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

uint64_t AlignDown(uint64_t v, uint64_t a) { return v & ~(a - 1); }
uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

}  // namespace

class OpenPack {
 public:
  ~OpenPack() {
    if (map != nullptr) ::munmap(map, entry.size);
  }

  std::string Name() const { return absl::StrCat("pack ", entry.label, " (", entry.path, ")"); }

  PackEntry entry;
  // The file as opened: what CheckFiles compares the path with, and what Reopen must find.
  dev_t dev = 0;
  ino_t ino = 0;
  uint64_t fingerprint = 0;
  UniqueFd fd;             // buffered descriptor: pread, fstat, and the mmap size check
  UniqueFd direct_fd;      // O_DIRECT descriptor (method kDirect)
  uint8_t* map = nullptr;  // whole-file mapping (method kMmap, non-empty file)
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

// One primitive read attempt: `op` returns bytes, or -1 with errno. The test hook may replace
// the result with an error or shorten it. Returns (bytes, 0) or (-1, errno).
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
  const int64_t n = op();
  if (n < 0) return {-1, errno};
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
    ASSIGN_OR_RETURN(
        const uint64_t n, Attempt(p, options, pos, want, [&] {
          return static_cast<int64_t>(::pread(p.fd.get(), dst, want, static_cast<off_t>(pos)));
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
      ASSIGN_OR_RETURN(const uint64_t n, Attempt(p, options, pos, want, [&] {
                         return static_cast<int64_t>(
                             ::pread(p.direct_fd.get(), dst, want, static_cast<off_t>(pos)));
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
    ASSIGN_OR_RETURN(const uint64_t n, Attempt(p, options, start, stop - start, [&] {
                       return static_cast<int64_t>(::pread(p.direct_fd.get(), bounce, stop - start,
                                                           static_cast<off_t>(start)));
                     }));
    if (start + n <= pos) {
      // Nothing new: the block before `pos` came back short. That is the end of the file when the
      // file no longer reaches `pos`; otherwise (an interrupted transfer) try again, boundedly.
      struct stat st {};
      if (n == 0 || (::fstat(p.fd.get(), &st) == 0 && static_cast<uint64_t>(st.st_size) <= pos) ||
          ++stalls > kMaxStalls) {
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

// A mapped file that shrinks raises SIGBUS on access to pages past its new end. The size is
// checked right before each copy, which catches truncation that happened earlier; truncation
// racing with the copy itself remains a risk (docs/readers.md).
absl::Status ReadMapped(const OpenPack& p, const PackSetOptions& options, uint64_t offset,
                        std::span<uint8_t> out) {
  uint64_t done = 0;
  while (done < out.size()) {
    const uint64_t pos = offset + done;
    const uint64_t want = out.size() - done;
    uint8_t* dst = out.data() + done;
    ASSIGN_OR_RETURN(const uint64_t n, Attempt(p, options, pos, want, [&]() -> int64_t {
                       struct stat st {};
                       if (::fstat(p.fd.get(), &st) != 0) return -1;
                       const auto now = static_cast<uint64_t>(st.st_size);
                       if (now <= pos) return 0;
                       const uint64_t k = std::min(want, now - pos);
                       std::memcpy(dst, p.map + pos, k);
                       return static_cast<int64_t>(k);
                     }));
    if (n == 0) return TruncatedError(p, pos, offset, out.size());
    done += n;
  }
  return absl::OkStatus();
}

struct DioAlign {
  bool known = false;  // the kernel reported alignment for this file (statx STATX_DIOALIGN)
  uint32_t mem = 0;    // 0 with known: the file does not support O_DIRECT
  uint32_t offset = 0;
};

DioAlign QueryDioAlign(int fd) {
  DioAlign out;
#ifdef STATX_DIOALIGN  // kernel headers >= 6.1; older builds use the block-size fallback
  struct statx stx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) != 0) {
    out.known = true;
    out.mem = stx.stx_dio_mem_align;
    out.offset = stx.stx_dio_offset_align;
  }
#else
  (void)fd;
#endif
  return out;
}

// Sets up O_DIRECT for `p`; returns a non-empty reason when the pack must fall back to pread.
absl::StatusOr<std::string> SetUpDirect(OpenPack& p, const struct stat& st) {
  const DioAlign dio = QueryDioAlign(p.fd.get());
  uint64_t mem = 4096;
  uint64_t off = std::max<uint64_t>(4096, static_cast<uint64_t>(st.st_blksize));
  if (dio.known) {
    if (dio.offset == 0 || dio.mem == 0) return std::string("statx: no direct I/O on this file");
    mem = dio.mem;
    off = dio.offset;
  }
  if (!IsPowerOfTwo(mem) || !IsPowerOfTwo(off)) {
    return absl::StrCat("unusable direct I/O alignment ", mem, "/", off);
  }
  const int dfd = ::open(p.entry.path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (dfd < 0) {
    const int err = errno;
    if (err == EINVAL) return std::string("open with O_DIRECT: EINVAL");
    return ErrnoError(ErrorKind::kIo, absl::StrCat(p.Name(), ": open with O_DIRECT"), err);
  }
  p.direct_fd = UniqueFd(dfd);
  p.entry.dio_mem_align = static_cast<uint32_t>(mem);
  p.entry.dio_offset_align = static_cast<uint32_t>(off);
  if (p.entry.size == 0) return std::string();
  // Some filesystems accept the flag at open and refuse the reads (EINVAL): probe one block.
  ReadScratch probe;
  uint8_t* buf = probe.Get(off, mem);
  if (buf == nullptr) return absl::ResourceExhaustedError("no memory for the O_DIRECT probe");
  auto op = [&] { return static_cast<int64_t>(::pread(dfd, buf, off, 0)); };
  const AttemptResult r = AttemptOnce(p, 0, off, op);
  if (r.err == EINVAL) {
    p.direct_fd.Reset();
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

absl::StatusOr<uint64_t> Fingerprint(int fd, uint64_t size, const std::string& name) {
  std::vector<uint8_t> head(std::min(size, kFingerprintBytes));
  uint64_t done = 0;
  while (done < head.size()) {
    const ssize_t n = ::pread(fd, head.data() + done, head.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(ErrorKind::kIo, absl::StrCat(name, ": read for its fingerprint"), errno);
    if (n == 0) return DataError(ErrorKind::kTruncated, absl::StrCat(name, ": shorter than its size"));
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

ReadScratch::~ReadScratch() { std::free(data_); }

uint8_t* ReadScratch::Get(uint64_t bytes, uint64_t align) {
  if (data_ != nullptr && bytes <= bytes_ && align <= align_ &&
      reinterpret_cast<uintptr_t>(data_) % align == 0) {
    return data_;
  }
  std::free(data_);
  data_ = nullptr;
  bytes_ = 0;
  void* p = nullptr;
  const uint64_t size = AlignUp(std::max<uint64_t>(bytes, 1), align);
  if (::posix_memalign(&p, std::max<uint64_t>(align, sizeof(void*)), size) != 0) return nullptr;
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
  const int fd = ::open(p->entry.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return ErrnoError(ErrorKind::kMissingFile, absl::StrCat(p->Name(), ": cannot open"), errno);
  }
  p->fd = UniqueFd(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return ErrnoError(ErrorKind::kIo, absl::StrCat(p->Name(), ": cannot stat"), errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidError(ErrorKind::kMissingFile, absl::StrCat(p->Name(), ": not a regular file"));
  }
  p->entry.size = static_cast<uint64_t>(st.st_size);
  p->dev = st.st_dev;
  p->ino = st.st_ino;
  ASSIGN_OR_RETURN(p->fingerprint, Fingerprint(fd, p->entry.size, p->Name()));

  p->entry.requested = spec.method.value_or(options_.method);
  p->entry.method = p->entry.requested;
  if (p->entry.requested == ReadMethod::kDirect) {
    ASSIGN_OR_RETURN(std::string why, SetUpDirect(*p, st));
    if (!why.empty()) {
      p->entry.method = ReadMethod::kPread;
      p->entry.method_note = std::move(why);
      p->entry.dio_mem_align = p->entry.dio_offset_align = 0;
    }
  } else if (p->entry.requested == ReadMethod::kMmap && p->entry.size > 0) {
    void* map = ::mmap(nullptr, p->entry.size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      // ENODEV: the filesystem cannot map files, which is a missing feature, not a failure.
      if (err != ENODEV) return ErrnoError(ErrorKind::kIo, absl::StrCat(p->Name(), ": mmap"), err);
      p->entry.method = ReadMethod::kPread;
      p->entry.method_note = "mmap: ENODEV (the filesystem cannot map files)";
    } else {
      p->map = static_cast<uint8_t*>(map);
    }
  }

  p->syscalls.store(0, std::memory_order_relaxed);  // the O_DIRECT probe is not a pack read

  const std::string group = spec.group.empty()
                                ? absl::StrCat("dev:", major(st.st_dev), ":", minor(st.st_dev))
                                : spec.group;
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
    struct stat at {};
    struct stat open_st {};
    dev_t dev;
    ino_t ino;
    {
      std::lock_guard lock(p.mu);  // Reopen changes them
      dev = p.dev;
      ino = p.ino;
    }
    if (::stat(p.entry.path.c_str(), &at) != 0) {
      why = ErrnoError(ErrorKind::kMissingFile,
                       absl::StrCat(p.Name(), ": its path no longer names a file"), errno);
    } else if (at.st_dev != dev || at.st_ino != ino) {
      why = absl::FailedPreconditionError(absl::StrCat(
          p.Name(), ": replaced since it was opened (inode ", at.st_ino, ", was ", ino,
          "); put the file back and reload (SIGHUP), or restart to serve the new one"));
    } else if (::fstat(p.fd.get(), &open_st) == 0 &&
               static_cast<uint64_t>(open_st.st_size) < p.entry.size) {
      why = DataError(ErrorKind::kTruncated,
                      absl::StrCat(p.Name(), ": truncated to ", open_st.st_size, " bytes (it had ",
                                   p.entry.size, " at open); put the file back and reload (SIGHUP)"));
    } else {
      const int probe = ::open(p.entry.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (probe < 0) {
        // FAILED_PRECONDITION, like the other cases: the operator has to act (clients retry
        // UNAVAILABLE, which would only make every acquire wait out its timeout).
        why = MakeError(absl::StatusCode::kFailedPrecondition, ErrorKind::kIo,
                        absl::StrCat(p.Name(), ": can no longer be opened: ", std::strerror(errno),
                                     "; make it readable again and reload (SIGHUP)"));
      } else {
        ::close(probe);
      }
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
  UniqueFd fd(::open(p.entry.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return refuse(absl::StrCat("cannot open it: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return refuse("not a regular file");
  if (static_cast<uint64_t>(st.st_size) != p.entry.size) {
    return refuse(absl::StrCat("it has ", st.st_size, " bytes, the file served had ",
                               p.entry.size, "; restart the daemon to serve another file"));
  }
  absl::StatusOr<uint64_t> fp = Fingerprint(fd.get(), p.entry.size, p.Name());
  if (!fp.ok()) return refuse(std::string(fp.status().message()));
  if (*fp != p.fingerprint) {
    return refuse("its first MiB differs from the file served: another file; restart the "
                  "daemon to serve it");
  }
  UniqueFd direct;
  if (p.direct_fd.get() >= 0) {
    direct = UniqueFd(::open(p.entry.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
    if (direct.get() < 0) return refuse(absl::StrCat("O_DIRECT open: ", std::strerror(errno)));
  }
  if (p.map != nullptr &&
      ::mmap(p.map, p.entry.size, PROT_READ, MAP_SHARED | MAP_FIXED, fd.get(), 0) == MAP_FAILED) {
    return refuse(absl::StrCat("mmap: ", std::strerror(errno)));
  }
  // Readers use the descriptor numbers concurrently: dup2 swaps the file under them at once.
  if (::dup2(fd.get(), p.fd.get()) < 0 ||
      (direct.get() >= 0 && ::dup2(direct.get(), p.direct_fd.get()) < 0)) {
    return refuse(absl::StrCat("dup2: ", std::strerror(errno)));
  }
  std::lock_guard lock(p.mu);
  p.dev = st.st_dev;
  p.ino = st.st_ino;
  p.failure = absl::OkStatus();
  p.failed.store(false, std::memory_order_release);
  return absl::OkStatus();
}

bool PackSet::failed(PackId id) const {
  return packs_.at(id)->failed.load(std::memory_order_acquire);
}

PrivateMapping::PrivateMapping(PrivateMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PrivateMapping& PrivateMapping::operator=(PrivateMapping&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, bytes_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PrivateMapping::~PrivateMapping() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
}

absl::StatusOr<PrivateMapping> PackSet::MapPrivate(PackId id) const {
  const OpenPack& p = *packs_.at(id);
  if (p.map == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(p.Name(), ": only a pack read with mmap has a mapping to register"));
  }
  void* map = ::mmap(nullptr, p.entry.size, PROT_READ | PROT_WRITE, MAP_PRIVATE, p.fd.get(), 0);
  if (map == MAP_FAILED) {
    return ErrnoError(ErrorKind::kIo, absl::StrCat(p.Name(), ": private mmap"), errno);
  }
  return PrivateMapping(static_cast<uint8_t*>(map), p.entry.size);
}

std::span<const uint8_t> PackSet::mapping(PackId id) const {
  const OpenPack& p = *packs_.at(id);
  if (p.map == nullptr) return {};
  return {p.map, p.entry.size};
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
