// A session's request lane: two byte rings in one shared-memory segment beside the gRPC stream,
// carrying Acquire, Prefetch and Release to the daemon and Grant, RequestError and LeaseExpired
// back, without a system call on the hot path. docs/protocol.md ("The request lane") is the
// wire contract; this header is its implementation for both ends.
//
// Segment layout (little-endian, offsets in bytes):
//   0     LaneHeader                  written by the daemon before the client maps it
//   64    request head  (u64)         client: bytes written into the request ring
//   128   request tail  (u64)         daemon: bytes consumed
//   192   daemon doorbell (u32), daemon sleeping (u32)
//   256   response head (u64)         daemon
//   320   response tail (u64)         client
//   384   client doorbell (u32), clients sleeping (u32)
//   448   lane state (u32: 0 open, 1 failed by the daemon, 2 closed)
//   4096  request ring, then response ring (sizes in the header, multiples of 4096), then the
//         session's pin words (client-side hits, engine/residency.h): u64 per slot of every
//         slot class, classes in order; none when the daemon offers no client-side hits
// Positions only grow; a record starts at position % ring size and never wraps: the writer fills
// the rest of the ring with a pad record first. Records are 16-byte aligned (RecordHead below).
//
// Trust: the daemon treats everything the client can write (the whole segment) as hostile. It
// keeps its own copies of its positions, checks every index and record before use, copies a
// record out of shared memory before decoding it, and fails only that session when something is
// impossible. The client trusts the daemon's records but still bounds-checks them.
//
// Threading: LaneDaemonEnd's reading side is used by one thread (the session's lane thread); its
// writing side is serialised by the caller. LaneClientEnd: writes under the caller's lock; reads
// by one thread at a time (the caller's lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace expertd::lane {

inline constexpr uint64_t kLaneMagic = 0x31656e616c647865;  // "exdlane1" little-endian
inline constexpr uint32_t kLaneVersion = 1;
inline constexpr uint64_t kRingsOffset = 4096;
inline constexpr uint64_t kRecordAlign = 16;
// The largest record either side writes or accepts.
inline constexpr uint32_t kMaxRecordBytes = 16384;

struct LaneHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  uint64_t request_offset;
  uint64_t request_bytes;
  uint64_t response_offset;
  uint64_t response_bytes;
  uint64_t segment_bytes;
};

enum class RecordType : uint16_t {
  kPad = 0,
  kAcquire = 1,       // count = experts; body: u32 layer, u32 0, u32 experts[count]
  kPrefetch = 2,      // count = groups; body: groups {u32 layer, u32 n, u32 experts[n]}, each 8-aligned
  kRelease = 3,       // count = leases; body: u64 leases[count]
  kHits = 4,          // count = experts; body: u32 layer, u32 0, u32 experts[count]: client-side
                      //   hits made and given back (no answer; need not wake the daemon)
  kGrant = 0x81,      // count = slots; body: u64 lease, u32 layer, u32 0, u64 stall_ns,
                      //   slots {u32 expert, u32 slot_class, u32 slot, u32 flags (1 = hit), u64 generation}
  kError = 0x82,      // count = 0; body: i32 code, u32 message bytes, message
  kLeaseExpired = 0x83,  // count = 0; body: u64 lease
};

struct RecordHead {
  uint32_t size;  // bytes of the whole record, a multiple of kRecordAlign
  uint16_t type;  // RecordType
  uint16_t count;
  uint64_t seq;   // the client's sequence number (requests, Grant, Error); 0 otherwise
};
static_assert(sizeof(RecordHead) == 16);

// Ring sizes: multiples of 4096, at least 4 × kMaxRecordBytes, at most 16 MiB each.
struct LaneGeometry {
  uint64_t request_bytes = 64 << 10;
  uint64_t response_bytes = 256 << 10;
  uint64_t pin_words = 0;  // client-side hits: one per slot of the model (at most 2^24)
  uint64_t pins_offset() const { return kRingsOffset + request_bytes + response_bytes; }
  uint64_t segment_bytes() const {
    return pins_offset() + (pin_words * 8 + 4095) / 4096 * 4096;
  }
};
absl::Status CheckGeometry(const LaneGeometry& g);

// ---- Decoded messages ------------------------------------------------------------------------

struct PrefetchGroup {
  uint32_t layer = 0;
  std::vector<uint32_t> experts;
};

struct Request {
  RecordType type = RecordType::kPad;
  uint64_t seq = 0;
  uint32_t layer = 0;                 // kAcquire, kHits
  std::vector<uint32_t> experts;      // kAcquire, kHits
  std::vector<PrefetchGroup> groups;  // kPrefetch
  std::vector<uint64_t> leases;       // kRelease
};

struct GrantSlot {
  uint32_t expert = 0;
  uint32_t slot_class = 0;
  uint32_t slot = 0;
  bool hit = false;
  uint64_t generation = 0;
};

struct Response {
  RecordType type = RecordType::kPad;
  uint64_t seq = 0;
  uint64_t lease = 0;     // kGrant, kLeaseExpired
  uint32_t layer = 0;     // kGrant
  uint64_t stall_ns = 0;  // kGrant
  std::vector<GrantSlot> slots;
  int32_t code = 0;       // kError: an absl::StatusCode
  std::string message;    // kError
};

// Encoders append one record to `out`. InvalidArgument when it would exceed kMaxRecordBytes or
// a count field (65535).
absl::Status EncodeAcquire(uint64_t seq, uint32_t layer, std::span<const uint32_t> experts,
                           std::vector<uint8_t>* out);
absl::Status EncodePrefetch(std::span<const PrefetchGroup> groups, std::vector<uint8_t>* out);
absl::Status EncodeRelease(uint64_t seq, std::span<const uint64_t> leases,
                           std::vector<uint8_t>* out);
absl::Status EncodeHits(uint32_t layer, std::span<const uint32_t> experts,
                        std::vector<uint8_t>* out);
absl::Status EncodeGrant(const Response& grant, std::vector<uint8_t>* out);
// Messages longer than 1024 bytes are cut.
absl::Status EncodeError(uint64_t seq, int32_t code, std::string_view message,
                         std::vector<uint8_t>* out);
absl::Status EncodeLeaseExpired(uint64_t lease, std::vector<uint8_t>* out);

// Decoders take one whole record (private memory). InvalidArgument, naming the field, for
// anything malformed: a wrong type for the direction, a size that does not match the counts, a
// nonzero reserved field.
absl::StatusOr<Request> DecodeRequest(std::span<const uint8_t> record);
absl::StatusOr<Response> DecodeResponse(std::span<const uint8_t> record);

// ---- The segment's shared words --------------------------------------------------------------

struct LaneWords {
  uint64_t* request_head;
  uint64_t* request_tail;
  uint32_t* daemon_doorbell;
  uint32_t* daemon_sleeping;
  uint64_t* response_head;
  uint64_t* response_tail;
  uint32_t* client_doorbell;
  uint32_t* clients_sleeping;
  uint32_t* state;
  uint8_t* request_ring;
  uint8_t* response_ring;
  uint64_t* pins;  // geometry.pin_words of them (nullptr when 0)
};
inline constexpr uint32_t kStateOpen = 0;
inline constexpr uint32_t kStateFailed = 1;
inline constexpr uint32_t kStateClosed = 2;

// ---- The daemon's end -----------------------------------------------------------------------

struct DaemonCounters {
  uint64_t requests = 0;
  uint64_t responses = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t sleeps = 0;  // times the lane thread went to sleep on the doorbell
  uint64_t client_wakes = 0;  // futex wakes sent to sleeping clients
};

class LaneDaemonEnd {
 public:
  // Formats a zeroed segment of `geometry.segment_bytes()` bytes at `base` (the daemon's
  // mapping) and returns its end. The geometry is kept privately: nothing the client writes into
  // the header is read back.
  static absl::StatusOr<LaneDaemonEnd> Format(uint8_t* base, const LaneGeometry& geometry);

  // The next request: OK with `*got` false when the ring is empty (or a ring's worth of pad
  // records was skipped: call again after looking at your stop flag); InvalidArgument (the session
  // must fail) when the client broke the protocol: its head moved back or past the ring, a
  // record is malformed or larger than kMaxRecordBytes. After an error the end stays failed.
  absl::Status Next(Request* request, bool* got);
  // True when the client published bytes not consumed yet (or moved its head impossibly).
  bool HasInput() const;

  // Appends one encoded record to the response ring: true when written, false when the ring has
  // no room (the caller keeps it and tries again). InvalidArgument when the client moved its
  // response tail impossibly (back, or past what was written).
  absl::StatusOr<bool> Write(std::span<const uint8_t> record);
  // Wakes clients sleeping on the response ring, if any said so.
  void WakeClient();

  // The lane thread's sleep: marks the daemon sleeping, re-checks for input and `stop`, and
  // waits on the doorbell up to `timeout`. Returns at once when input is there. The doorbell is
  // a word the client can write, so a wake can be lost to it: keep `timeout` finite.
  void Sleep(absl::Duration timeout, const std::atomic<bool>& stop);
  // Rings the daemon's own doorbell (to end a Sleep from another daemon thread).
  void Ring();
  // Marks the lane failed or closed for the client (it stops writing and waits no longer).
  void SetState(uint32_t state);

  // A snapshot; safe from any thread.
  DaemonCounters counters() const;
  // The session's pin words (empty without client-side hits): the client's to write.
  std::span<uint64_t> pins() const { return {w_.pins, w_.pins ? g_.pin_words : 0}; }

 private:
  LaneDaemonEnd(LaneWords w, LaneGeometry g) : w_(w), g_(g) {}
  LaneWords w_;
  LaneGeometry g_;
  uint64_t request_tail_ = 0;   // private copies: the shared ones are only published
  uint64_t response_head_ = 0;
  uint64_t response_tail_seen_ = 0;
  bool failed_ = false;
  std::vector<uint8_t> scratch_;
  struct Counters {
    std::atomic<uint64_t> requests{0}, responses{0}, bytes_in{0}, bytes_out{0}, sleeps{0},
        client_wakes{0};
  };
  std::unique_ptr<Counters> counters_ = std::make_unique<Counters>();
};

// ---- The client's end -----------------------------------------------------------------------

class LaneClientEnd {
 public:
  // Checks a mapped segment against the geometry the daemon announced.
  static absl::StatusOr<LaneClientEnd> Attach(uint8_t* base, uint64_t bytes,
                                              const LaneGeometry& geometry);

  // Appends one encoded record and, with `wake`, rings the daemon if it sleeps: true when
  // written, false when the request ring is full (the daemon has not caught up). Without `wake`
  // the record waits for the daemon's next look at the lane: the next rung write, Flush, or the
  // end of the lane thread's sleep (2 s at most).
  bool Write(std::span<const uint8_t> record, bool wake = true);
  // Rings the daemon if it sleeps while requests wait that it has not read.
  void Flush();
  // The next response: OK with `*got` false when there is none; an error when the daemon's
  // record is malformed (a daemon bug: the session is unusable).
  absl::Status Next(Response* response, bool* got);
  bool HasInput() const;
  // Sleeps on the response doorbell up to `timeout` unless input arrived since `seen` (the
  // doorbell value read before the caller last looked for input).
  uint32_t doorbell() const;
  void Sleep(uint32_t seen, absl::Duration timeout);
  // Wakes every thread of this process sleeping on the lane (session end, or another thread's
  // answer was read for it).
  void WakeAll();
  uint32_t state() const;
  // This session's pin words (empty without client-side hits).
  std::span<uint64_t> pins() const { return {w_.pins, w_.pins ? g_.pin_words : 0}; }

 private:
  LaneClientEnd(LaneWords w, LaneGeometry g) : w_(w), g_(g) {}
  LaneWords w_;
  LaneGeometry g_;
};

}  // namespace expertd::lane
