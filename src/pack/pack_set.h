// Packs (read-only files holding expert bytes: the GGUF shards and the index's Q packs) opened
// once, grouped into source groups (packs on one drive), and read with one of three methods.
//
// Reads go through PackSet::Read, which is thread-safe and is what the reader pools
// (pack/reader_pool.h) call from their threads. Errors name the pack's label, path and the byte
// offset, and carry an ErrorKind: kOutOfBounds (range outside the pack, nothing read), kTruncated
// (the file ended early: it shrank after open), kIo (a system call failed; after repeated EIO the
// pack is marked failed and every later read of it fails at once, without I/O).
//
// See docs/readers.md for the methods, the measurements behind the defaults and the limits of
// grouping by device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "util/os_file.h"

namespace expertd {

// Position of a pack in the list given to PackSet::Open (the catalog's pack numbering).
using PackId = uint32_t;
// Position of a source group in PackSet::groups().
using GroupId = uint32_t;

// How a pack's bytes reach the destination.
enum class ReadMethod {
  kPread,   // pread(2) through the page cache (the default)
  kDirect,  // O_DIRECT: aligned blocks straight into the destination, the rest via a bounce buffer
  kMmap,    // memcpy from a read-only shared mapping of the whole file
};
std::string_view ReadMethodName(ReadMethod method);  // "pread", "direct", "mmap"
// Parses a ReadMethodName; anything else is InvalidArgument (kBadValue) listing the valid names.
absl::StatusOr<ReadMethod> ParseReadMethod(std::string_view name);

// Test-only fault injection, consulted before every primitive read attempt of one pack (each
// pread, each O_DIRECT pread of an aligned span, each copy from the mapping; retries included;
// also the probe read that checks O_DIRECT at open). Arguments: the file offset and byte count
// of the attempt. Return:
//   >= bytes       the attempt runs normally;
//   0 <= r < bytes the attempt runs but reports only r bytes (a short read; 0 = end of file);
//   < 0            the attempt fails with errno -r and nothing is read (-EIO, -EINTR, -EAGAIN).
// May block or sleep (to model a slow drive). Called concurrently from reader threads, so it
// must be thread-safe. Production code leaves it empty; the read path pays one null check.
using PackReadHook = std::function<int64_t(uint64_t offset, uint64_t bytes)>;

// One pack to open.
struct PackSpec {
  std::string path;
  std::string label;  // short name used in messages and statistics ("P", "P2/3", "Q1" ...)
  // Source group name. Empty: grouped by the underlying device (st_dev), named "dev:MAJ:MIN"
  // (on Windows by volume, "vol:SERIAL": FileInfo::volume_group).
  // Packs with the same name share one group; naming a pack "dev:8:0" joins that device group.
  std::string group;
  std::optional<ReadMethod> method;  // overrides PackSetOptions::method for this pack
  PackReadHook test_hook;            // tests only (see PackReadHook)
};

struct PackSetOptions {
  ReadMethod method = ReadMethod::kPread;
  // EIO attempts repeated after the first one before the pack is marked failed.
  uint32_t max_eio_retries = 2;
  // Largest single O_DIRECT read through a bounce buffer (rounded up to the pack's alignment).
  uint64_t direct_chunk_bytes = 4ull << 20;
};

// What PackSet::Open found out about one pack.
struct PackEntry {
  std::string path;
  std::string label;
  uint64_t size = 0;  // bytes at open; reads are bounds-checked against it
  GroupId group = 0;
  ReadMethod requested = ReadMethod::kPread;
  ReadMethod method = ReadMethod::kPread;  // what is actually used (direct/mmap may fall back)
  std::string method_note;  // why `method` differs from `requested`; empty when they agree
  // O_DIRECT alignment in bytes (method kDirect only): buffer address, and file offset/length.
  uint32_t dio_mem_align = 0;
  uint32_t dio_offset_align = 0;
};

// Packs on one drive: read by one reader pool, so separate drives are read in parallel.
struct SourceGroup {
  std::string name;
  std::vector<PackId> packs;
};

class OpenPack;  // one open pack: descriptors, mapping, counters (pack_set.cpp)

// Per-pack counters (a snapshot; every field is read atomically but not all at one instant).
struct PackStats {
  uint64_t bytes_read = 0;  // bytes delivered to destinations (merged gaps included)
  uint64_t reads = 0;       // PackSet::Read calls that did I/O (one per merged range)
  uint64_t syscalls = 0;    // primitive attempts (pread / O_DIRECT pread / mapping copy)
  uint64_t retries = 0;     // attempts repeated after EINTR, EAGAIN or EIO
  uint64_t errors = 0;      // Read calls that returned an error (bounds errors excluded)
  bool failed = false;      // marked failed after repeated EIO
};

// Scratch memory of one reading thread: the aligned bounce buffer of O_DIRECT reads. Not
// thread-safe; each reader thread owns one. Grows on demand up to
// PackSetOptions::direct_chunk_bytes and is freed with the object.
class ReadScratch {
 public:
  ReadScratch() = default;
  ~ReadScratch();
  ReadScratch(const ReadScratch&) = delete;
  ReadScratch& operator=(const ReadScratch&) = delete;
  // A buffer of at least `bytes` aligned to `align` (a power of two); nullptr when out of memory.
  uint8_t* Get(uint64_t bytes, uint64_t align);

 private:
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t align_ = 0;
};

// The open packs. Immutable after Open except for counters, the failed marks and Reopen (which
// swaps a failed pack's file in place under the same descriptor numbers and mapping address),
// so all const methods may be called from any thread. Owns every file descriptor and mapping; must
// outlive the reader pools that read from it. A private writable mapping of a whole pack
// (PackSet::MapPrivate), unmapped when destroyed. Move-only.
class PrivateMapping {
 public:
  PrivateMapping() = default;
  explicit PrivateMapping(FileMapping mapping) : mapping_(std::move(mapping)) {}
  std::span<uint8_t> data() const { return {mapping_.data(), mapping_.bytes()}; }

 private:
  FileMapping mapping_;
};

class PackSet {
 public:
  // Opens every pack. A pack that cannot be opened fails the whole set: kMissingFile (NotFound
  // when the file does not exist) naming its label and path. Empty `packs` is allowed.
  static absl::StatusOr<std::unique_ptr<PackSet>> Open(std::vector<PackSpec> packs,
                                                       const PackSetOptions& options);
  ~PackSet();
  PackSet(const PackSet&) = delete;
  PackSet& operator=(const PackSet&) = delete;

  size_t size() const { return packs_.size(); }
  const PackEntry& pack(PackId id) const;
  const std::vector<SourceGroup>& groups() const { return groups_; }

  // Checks that [offset, offset + bytes) lies inside pack `id` (OutOfRange, kOutOfBounds; an
  // unknown id is InvalidArgument, kBadValue) and that the pack has not failed (its failure).
  absl::Status CheckRange(PackId id, uint64_t offset, uint64_t bytes) const;

  // Reads exactly out.size() bytes of pack `id` at byte `offset` into `out` (any address) with
  // the pack's method. EINTR and EAGAIN are retried; EIO up to max_eio_retries times, then the
  // pack is marked failed. On error `out` holds unspecified bytes. Thread-safe; `scratch` must be
  // the calling thread's own.
  absl::Status Read(PackId id, uint64_t offset, std::span<uint8_t> out, ReadScratch& scratch) const;
  // The same with a temporary scratch (tools and tests; allocates for O_DIRECT).
  absl::Status Read(PackId id, uint64_t offset, std::span<uint8_t> out) const;

  bool failed(PackId id) const;
  // Why pack `id` failed (OK while it has not).
  absl::Status failure(PackId id) const;
  PackStats stats(PackId id) const;

  // Whether each pack's path still names the file that was opened, whole: a path that is gone
  // or cannot be opened any more, that names another file (replaced: a new inode), or a file
  // shorter than at open (truncated) marks the pack failed with that reason, naming the pack.
  // Every read of a failed pack returns the failure. Returns the packs newly marked failed by
  // this call (one stat and one open per pack; cheap enough to call every few seconds).
  std::vector<PackId> CheckFiles() const;
  // A failed pack, once its file is back: opens its path again and, when the file there has
  // the size and the fingerprint (a hash of its first MiB) of the one opened at first, serves
  // from it (the handles are swapped in place, OsFile::ReplaceWith; a mapping with
  // FileMapping::RemapInPlace) and
  // clears the failure. FailedPrecondition, naming the pack, when the file is not back or is
  // another one; the pack then stays failed.
  absl::Status Reopen(PackId id);
  // The whole-file read-only mapping of a pack read with method kMmap; empty for the others.
  // Lives as long as the PackSet. A device may register it as staging (the direct path).
  std::span<const uint8_t> mapping(PackId id) const;
  // A second whole-file mapping of a kMmap pack, private and writable (MAP_PRIVATE, PROT_READ |
  // PROT_WRITE), for a device that can register only writable memory: nothing written to it —
  // nor the copy-on-write of every page that registering it for write causes — reaches the
  // file. FailedPrecondition for a pack not read with kMmap; the mmap error otherwise.
  absl::StatusOr<PrivateMapping> MapPrivate(PackId id) const;

 private:
  explicit PackSet(const PackSetOptions& options);
  absl::Status OpenOne(PackSpec spec);

  PackSetOptions options_;
  std::vector<std::unique_ptr<OpenPack>> packs_;
  std::vector<SourceGroup> groups_;
};

}  // namespace expertd
