#include "lane/lane.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "util/futex.h"
#include "util/status.h"

namespace expertd::lane {
namespace {

static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

uint64_t Load(uint64_t* word, std::memory_order order = std::memory_order_acquire) {
  return std::atomic_ref<uint64_t>(*word).load(order);
}
uint32_t Load32(uint32_t* word) {
  return std::atomic_ref<uint32_t>(*word).load(std::memory_order_seq_cst);
}
void Store(uint64_t* word, uint64_t value) {
  std::atomic_ref<uint64_t>(*word).store(value, std::memory_order_seq_cst);
}
void Store32(uint32_t* word, uint32_t value) {
  std::atomic_ref<uint32_t>(*word).store(value, std::memory_order_seq_cst);
}
void Ding(uint32_t* doorbell) {
  std::atomic_ref<uint32_t>(*doorbell).fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(doorbell);
}


LaneWords WordsAt(uint8_t* base, const LaneGeometry& g) {
  LaneWords w;
  w.request_head = reinterpret_cast<uint64_t*>(base + 64);
  w.request_tail = reinterpret_cast<uint64_t*>(base + 128);
  w.daemon_doorbell = reinterpret_cast<uint32_t*>(base + 192);
  w.daemon_sleeping = reinterpret_cast<uint32_t*>(base + 196);
  w.response_head = reinterpret_cast<uint64_t*>(base + 256);
  w.response_tail = reinterpret_cast<uint64_t*>(base + 320);
  w.client_doorbell = reinterpret_cast<uint32_t*>(base + 384);
  w.clients_sleeping = reinterpret_cast<uint32_t*>(base + 388);
  w.state = reinterpret_cast<uint32_t*>(base + 448);
  w.request_ring = base + kRingsOffset;
  w.response_ring = base + kRingsOffset + g.request_bytes;
  w.pins = g.pin_words ? reinterpret_cast<uint64_t*>(base + g.pins_offset()) : nullptr;
  return w;
}

// Writes `record` into a ring whose consumer is at `tail`: a pad record first when it would not
// fit before the end. False when there is no room; `*head` advances past what was written.
bool Put(uint8_t* ring, uint64_t size, uint64_t* head, uint64_t tail,
         std::span<const uint8_t> record) {
  const uint64_t free = size - (*head - tail);
  const uint64_t pos = *head % size;
  const uint64_t contig = size - pos;
  const uint64_t need = record.size() <= contig ? record.size() : contig + record.size();
  if (need > free) return false;
  if (record.size() > contig) {
    const RecordHead pad{static_cast<uint32_t>(contig), static_cast<uint16_t>(RecordType::kPad), 0, 0};
    std::memcpy(ring + pos, &pad, sizeof pad);
    *head += contig;
  }
  std::memcpy(ring + *head % size, record.data(), record.size());
  *head += record.size();
  return true;
}

// Appends a record: its head, then the body bytes, padded to kRecordAlign.
class Builder {
 public:
  Builder(RecordType type, uint16_t count, uint64_t seq, std::vector<uint8_t>* out)
      : out_(out), start_(out->size()) {
    const RecordHead h{0, static_cast<uint16_t>(type), count, seq};
    Append(&h, sizeof h);
  }
  void Append(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  template <typename T>
  void Put(T v) {
    Append(&v, sizeof v);
  }
  void Align(uint64_t to) { out_->resize(start_ + (out_->size() - start_ + to - 1) / to * to, 0); }
  absl::Status Finish() {
    Align(kRecordAlign);
    const uint64_t size = out_->size() - start_;
    if (size > kMaxRecordBytes) {
      out_->resize(start_);
      return absl::InvalidArgumentError(
          absl::StrCat("lane record of ", size, " bytes; at most ", kMaxRecordBytes));
    }
    const auto s = static_cast<uint32_t>(size);
    std::memcpy(out_->data() + start_, &s, sizeof s);
    return absl::OkStatus();
  }

 private:
  std::vector<uint8_t>* out_;
  size_t start_;
};

absl::Status CountFits(size_t n, std::string_view what) {
  if (n <= 0xffff) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(n, " ", AV(what), " in one lane record; at most 65535"));
}

// Reads a record's fields front to back, refusing to run past its end.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> r) : r_(r) {}
  template <typename T>
  bool Get(T* v) {
    if (r_.size() - at_ < sizeof(T)) return false;
    std::memcpy(v, r_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool Bytes(size_t n, std::string* out) {
    if (r_.size() - at_ < n) return false;
    out->assign(reinterpret_cast<const char*>(r_.data()) + at_, n);
    at_ += n;
    return true;
  }
  // Skips to the next multiple of `to`; false when a skipped byte is not zero.
  bool Align(uint64_t to) {
    const size_t next = std::min<uint64_t>(r_.size(), (at_ + to - 1) / to * to);
    bool zero = true;
    for (; at_ < next; ++at_) zero = zero && r_[at_] == 0;
    return zero;
  }
  size_t at() const { return at_; }
  size_t size() const { return r_.size(); }

 private:
  std::span<const uint8_t> r_;
  size_t at_ = 0;
};

absl::Status Malformed(const RecordHead& h, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("lane record (type ", h.type, ", ", h.size,
                                                 " bytes, seq ", h.seq, "): ", AV(why)));
}

absl::StatusOr<RecordHead> HeadOf(std::span<const uint8_t> record) {
  RecordHead h{};
  if (record.size() < sizeof h) {
    return absl::InvalidArgumentError(absl::StrCat("lane record of ", record.size(), " bytes"));
  }
  std::memcpy(&h, record.data(), sizeof h);
  if (h.size != record.size()) return Malformed(h, absl::StrCat("its size field says ", h.size));
  return h;
}

// A decoded record must use exactly its size: the body length follows from the counts.
absl::Status ExactEnd(const RecordHead& h, Cursor& c) {
  if (!c.Align(kRecordAlign)) return Malformed(h, "nonzero padding");
  if (c.at() != c.size()) {
    return Malformed(h, absl::StrCat("its counts describe ", sizeof(RecordHead) + c.at(), " bytes"));
  }
  return absl::OkStatus();
}

// Checks a ring position published by the other side against the private one.
absl::Status CheckAhead(uint64_t theirs, uint64_t ours, uint64_t ring, std::string_view what) {
  if (theirs < ours) {
    return absl::InvalidArgumentError(
        absl::StrCat("lane ", AV(what), " moved back from ", ours, " to ", theirs));
  }
  if (theirs - ours > ring) {
    return absl::InvalidArgumentError(absl::StrCat("lane ", AV(what), " at ", theirs, " is ",
                                                   theirs - ours, " bytes ahead in a ring of ",
                                                   ring));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckGeometry(const LaneGeometry& g) {
  for (uint64_t b : {g.request_bytes, g.response_bytes}) {
    if (b % 4096 != 0 || b < 4 * uint64_t{kMaxRecordBytes} || b > (uint64_t{16} << 20)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lane ring of ", b, " bytes: a multiple of 4096 from ", 4 * kMaxRecordBytes,
          " to 16 MiB"));
    }
  }
  if (g.pin_words > (uint64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lane pin words: ", g.pin_words, " (at most 2^24, one per slot)"));
  }
  return absl::OkStatus();
}

// ---- Encoders --------------------------------------------------------------------------------

absl::Status EncodeAcquire(uint64_t seq, uint32_t layer, std::span<const uint32_t> experts,
                           std::vector<uint8_t>* out) {
  if (absl::Status st = CountFits(experts.size(), "experts"); !st.ok()) return st;
  Builder b(RecordType::kAcquire, static_cast<uint16_t>(experts.size()), seq, out);
  b.Put(layer);
  b.Put(uint32_t{0});
  b.Append(experts.data(), experts.size_bytes());
  return b.Finish();
}

absl::Status EncodePrefetch(std::span<const PrefetchGroup> groups, std::vector<uint8_t>* out) {
  if (absl::Status st = CountFits(groups.size(), "prefetch groups"); !st.ok()) return st;
  Builder b(RecordType::kPrefetch, static_cast<uint16_t>(groups.size()), 0, out);
  for (const PrefetchGroup& g : groups) {
    b.Put(g.layer);
    b.Put(static_cast<uint32_t>(g.experts.size()));
    b.Append(g.experts.data(), g.experts.size() * sizeof(uint32_t));
    b.Align(8);
  }
  return b.Finish();
}

absl::Status EncodeRelease(uint64_t seq, std::span<const uint64_t> leases,
                           std::vector<uint8_t>* out) {
  if (absl::Status st = CountFits(leases.size(), "leases"); !st.ok()) return st;
  Builder b(RecordType::kRelease, static_cast<uint16_t>(leases.size()), seq, out);
  b.Append(leases.data(), leases.size_bytes());
  return b.Finish();
}

absl::Status EncodeHits(uint32_t layer, std::span<const uint32_t> experts,
                        std::vector<uint8_t>* out) {
  if (absl::Status st = CountFits(experts.size(), "experts"); !st.ok()) return st;
  Builder b(RecordType::kHits, static_cast<uint16_t>(experts.size()), 0, out);
  b.Put(layer);
  b.Put(uint32_t{0});
  b.Append(experts.data(), experts.size_bytes());
  return b.Finish();
}

absl::Status EncodeGrant(const Response& g, std::vector<uint8_t>* out) {
  if (absl::Status st = CountFits(g.slots.size(), "slots"); !st.ok()) return st;
  Builder b(RecordType::kGrant, static_cast<uint16_t>(g.slots.size()), g.seq, out);
  b.Put(g.lease);
  b.Put(g.layer);
  b.Put(uint32_t{0});
  b.Put(g.stall_ns);
  for (const GrantSlot& s : g.slots) {
    b.Put(s.expert);
    b.Put(s.slot_class);
    b.Put(s.slot);
    b.Put(uint32_t{s.hit ? 1u : 0u});
    b.Put(s.generation);
  }
  return b.Finish();
}

absl::Status EncodeError(uint64_t seq, int32_t code, std::string_view message,
                         std::vector<uint8_t>* out) {
  message = message.substr(0, 1024);
  Builder b(RecordType::kError, 0, seq, out);
  b.Put(code);
  b.Put(static_cast<uint32_t>(message.size()));
  b.Append(message.data(), message.size());
  return b.Finish();
}

absl::Status EncodeLeaseExpired(uint64_t lease, std::vector<uint8_t>* out) {
  Builder b(RecordType::kLeaseExpired, 0, 0, out);
  b.Put(lease);
  return b.Finish();
}

// ---- Decoders --------------------------------------------------------------------------------

absl::StatusOr<Request> DecodeRequest(std::span<const uint8_t> record) {
  absl::StatusOr<RecordHead> head = HeadOf(record);
  if (!head.ok()) return head.status();
  const RecordHead h = *head;
  Cursor c(record.subspan(sizeof h));
  Request r;
  r.type = static_cast<RecordType>(h.type);
  r.seq = h.seq;
  switch (r.type) {
    case RecordType::kHits:
      if (h.seq != 0) return Malformed(h, "a hits record carries no seq (0)");
      [[fallthrough]];
    case RecordType::kAcquire: {
      uint32_t reserved = 0;
      if (!c.Get(&r.layer) || !c.Get(&reserved)) return Malformed(h, "too short for an acquire");
      if (reserved != 0) return Malformed(h, "reserved field is not 0");
      r.experts.resize(h.count);
      for (uint32_t& e : r.experts) {
        if (!c.Get(&e)) return Malformed(h, absl::StrCat("too short for ", h.count, " experts"));
      }
      break;
    }
    case RecordType::kPrefetch: {
      if (h.seq != 0) return Malformed(h, "a prefetch carries no seq (0)");
      r.groups.resize(h.count);
      for (PrefetchGroup& g : r.groups) {
        uint32_t n = 0;
        if (!c.Get(&g.layer) || !c.Get(&n)) return Malformed(h, "prefetch group cut short");
        if (uint64_t{n} * 4 > c.size() - c.at()) {
          return Malformed(h, absl::StrCat("prefetch group of layer ", g.layer, " claims ", n,
                                           " experts"));
        }
        g.experts.resize(n);
        for (uint32_t& e : g.experts) c.Get(&e);
        if (!c.Align(8)) return Malformed(h, "nonzero padding");
      }
      break;
    }
    case RecordType::kRelease:
      r.leases.resize(h.count);
      for (uint64_t& l : r.leases) {
        if (!c.Get(&l)) return Malformed(h, absl::StrCat("too short for ", h.count, " leases"));
      }
      break;
    default:
      return Malformed(h, "not a request type (1 acquire, 2 prefetch, 3 release, 4 hits)");
  }
  if (absl::Status st = ExactEnd(h, c); !st.ok()) return st;
  return r;
}

absl::StatusOr<Response> DecodeResponse(std::span<const uint8_t> record) {
  absl::StatusOr<RecordHead> head = HeadOf(record);
  if (!head.ok()) return head.status();
  const RecordHead h = *head;
  Cursor c(record.subspan(sizeof h));
  Response r;
  r.type = static_cast<RecordType>(h.type);
  r.seq = h.seq;
  switch (r.type) {
    case RecordType::kGrant: {
      uint32_t reserved = 0;
      if (!c.Get(&r.lease) || !c.Get(&r.layer) || !c.Get(&reserved) || !c.Get(&r.stall_ns)) {
        return Malformed(h, "too short for a grant");
      }
      r.slots.resize(h.count);
      for (GrantSlot& s : r.slots) {
        uint32_t flags = 0;
        if (!c.Get(&s.expert) || !c.Get(&s.slot_class) || !c.Get(&s.slot) || !c.Get(&flags) ||
            !c.Get(&s.generation)) {
          return Malformed(h, absl::StrCat("too short for ", h.count, " slots"));
        }
        s.hit = (flags & 1) != 0;
      }
      break;
    }
    case RecordType::kError: {
      uint32_t n = 0;
      if (!c.Get(&r.code) || !c.Get(&n) || !c.Bytes(n, &r.message)) {
        return Malformed(h, "error record cut short");
      }
      break;
    }
    case RecordType::kLeaseExpired:
      if (!c.Get(&r.lease)) return Malformed(h, "too short for a lease");
      break;
    default:
      return Malformed(h, "not a response type");
  }
  if (absl::Status st = ExactEnd(h, c); !st.ok()) return st;
  return r;
}

// ---- The daemon's end -----------------------------------------------------------------------

absl::StatusOr<LaneDaemonEnd> LaneDaemonEnd::Format(uint8_t* base, const LaneGeometry& g) {
  if (absl::Status st = CheckGeometry(g); !st.ok()) return st;
  const LaneHeader h{kLaneMagic,         kLaneVersion,     0, kRingsOffset, g.request_bytes,
                     kRingsOffset + g.request_bytes, g.response_bytes, g.segment_bytes()};
  std::memcpy(base, &h, sizeof h);
  return LaneDaemonEnd(WordsAt(base, g), g);
}

absl::Status LaneDaemonEnd::Next(Request* request, bool* got) {
  *got = false;
  if (failed_) return absl::FailedPreconditionError("the lane failed earlier");
  const auto fail = [this](absl::Status st) {
    failed_ = true;
    return st;
  };
  const uint64_t cap = g_.request_bytes;
  // Pad records are skipped here, at most a ring's worth per call: a client that writes nothing
  // but pads cannot keep the caller from looking at its stop flag.
  uint64_t skipped = 0;
  for (;;) {
    if (skipped >= cap) return absl::OkStatus();
    const uint64_t head = Load(w_.request_head);
    if (absl::Status st = CheckAhead(head, request_tail_, cap, "request head"); !st.ok()) {
      return fail(st);
    }
    const uint64_t avail = head - request_tail_;
    if (avail == 0) return absl::OkStatus();
    const uint64_t pos = request_tail_ % cap;
    const uint64_t contig = cap - pos;
    RecordHead h{};
    if (avail < sizeof h) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("lane request head at ", head, " ends inside a record")));
    }
    std::memcpy(&h, w_.request_ring + pos, sizeof h);
    if (h.size < sizeof h || h.size % kRecordAlign != 0 || h.size > contig || h.size > avail ||
        h.size > kMaxRecordBytes) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "lane request at ", request_tail_, " has size ", h.size, " (", avail,
          " bytes published, ", contig, " before the ring's end, at most ", kMaxRecordBytes,
          ", a multiple of ", kRecordAlign, ")")));
    }
    // The client may change the bytes at any time: decode a private copy, once.
    scratch_.assign(w_.request_ring + pos, w_.request_ring + pos + h.size);
    request_tail_ += h.size;
    Store(w_.request_tail, request_tail_);
    counters_->bytes_in += h.size;
    if (h.type == static_cast<uint16_t>(RecordType::kPad)) {
      skipped += h.size;
      continue;
    }
    absl::StatusOr<Request> r = DecodeRequest(scratch_);
    if (!r.ok()) return fail(r.status());
    *request = *std::move(r);
    ++counters_->requests;
    *got = true;
    return absl::OkStatus();
  }
}

bool LaneDaemonEnd::HasInput() const {
  return Load(w_.request_head, std::memory_order_seq_cst) != request_tail_;
}

absl::StatusOr<bool> LaneDaemonEnd::Write(std::span<const uint8_t> record) {
  const uint64_t tail = Load(w_.response_tail);
  if (tail < response_tail_seen_ || tail > response_head_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lane response tail at ", tail, ": it must stay between ", response_tail_seen_,
        " (its last value) and ", response_head_, " (what the daemon wrote)"));
  }
  response_tail_seen_ = tail;
  if (!Put(w_.response_ring, g_.response_bytes, &response_head_, tail, record)) return false;
  Store(w_.response_head, response_head_);
  ++counters_->responses;
  counters_->bytes_out += record.size();
  return true;
}

void LaneDaemonEnd::WakeClient() {
  if (Load32(w_.clients_sleeping) == 0) return;
  ++counters_->client_wakes;
  Ding(w_.client_doorbell);
}

void LaneDaemonEnd::Sleep(absl::Duration timeout, const std::atomic<bool>& stop) {
  const uint32_t seen = Load32(w_.daemon_doorbell);
  Store32(w_.daemon_sleeping, 1);
  if (!HasInput() && !stop.load()) {
    ++counters_->sleeps;
    FutexWait(w_.daemon_doorbell, seen, timeout);
  }
  Store32(w_.daemon_sleeping, 0);
}

DaemonCounters LaneDaemonEnd::counters() const {
  DaemonCounters c;
  c.requests = counters_->requests.load(std::memory_order_relaxed);
  c.responses = counters_->responses.load(std::memory_order_relaxed);
  c.bytes_in = counters_->bytes_in.load(std::memory_order_relaxed);
  c.bytes_out = counters_->bytes_out.load(std::memory_order_relaxed);
  c.sleeps = counters_->sleeps.load(std::memory_order_relaxed);
  c.client_wakes = counters_->client_wakes.load(std::memory_order_relaxed);
  return c;
}

void LaneDaemonEnd::Ring() { Ding(w_.daemon_doorbell); }

void LaneDaemonEnd::SetState(uint32_t state) {
  Store32(w_.state, state);
  Ding(w_.client_doorbell);
}

// ---- The client's end -----------------------------------------------------------------------

absl::StatusOr<LaneClientEnd> LaneClientEnd::Attach(uint8_t* base, uint64_t bytes,
                                                    const LaneGeometry& g) {
  if (absl::Status st = CheckGeometry(g); !st.ok()) return st;
  LaneHeader h{};
  if (bytes < g.segment_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lane segment of ", bytes, " bytes; its geometry needs ", g.segment_bytes()));
  }
  std::memcpy(&h, base, sizeof h);
  if (h.magic != kLaneMagic || h.version != kLaneVersion || h.request_bytes != g.request_bytes ||
      h.response_bytes != g.response_bytes || h.request_offset != kRingsOffset ||
      h.response_offset != kRingsOffset + g.request_bytes || h.segment_bytes != g.segment_bytes()) {
    return absl::InvalidArgumentError("the shared object is not a lane of the announced geometry");
  }
  return LaneClientEnd(WordsAt(base, g), g);
}

bool LaneClientEnd::Write(std::span<const uint8_t> record, bool wake) {
  uint64_t head = Load(w_.request_head, std::memory_order_relaxed);
  if (!Put(w_.request_ring, g_.request_bytes, &head, Load(w_.request_tail), record)) return false;
  Store(w_.request_head, head);
  if (wake && Load32(w_.daemon_sleeping) != 0) Ding(w_.daemon_doorbell);
  return true;
}

void LaneClientEnd::Flush() {
  if (Load32(w_.daemon_sleeping) != 0 && Load(w_.request_tail) != Load(w_.request_head)) {
    Ding(w_.daemon_doorbell);
  }
}

absl::Status LaneClientEnd::Next(Response* response, bool* got) {
  *got = false;
  const uint64_t cap = g_.response_bytes;
  uint64_t tail = Load(w_.response_tail, std::memory_order_relaxed);
  for (;;) {
    const uint64_t head = Load(w_.response_head);
    if (absl::Status st = CheckAhead(head, tail, cap, "response head"); !st.ok()) return st;
    if (head == tail) return absl::OkStatus();
    const uint64_t pos = tail % cap;
    const uint64_t contig = cap - pos;
    RecordHead h{};
    std::memcpy(&h, w_.response_ring + pos, sizeof h);
    if (h.size < sizeof h || h.size % kRecordAlign != 0 || h.size > contig ||
        h.size > head - tail) {
      return absl::InternalError(absl::StrCat("lane response at ", tail, " has size ", h.size));
    }
    const uint64_t at = pos;
    tail += h.size;
    if (h.type == static_cast<uint16_t>(RecordType::kPad)) {
      Store(w_.response_tail, tail);
      continue;
    }
    absl::StatusOr<Response> r = DecodeResponse({w_.response_ring + at, h.size});
    Store(w_.response_tail, tail);
    if (!r.ok()) return absl::InternalError(r.status().message());
    *response = *std::move(r);
    *got = true;
    return absl::OkStatus();
  }
}

bool LaneClientEnd::HasInput() const {
  return Load(w_.response_head, std::memory_order_seq_cst) !=
         Load(w_.response_tail, std::memory_order_relaxed);
}

uint32_t LaneClientEnd::doorbell() const { return Load32(w_.client_doorbell); }

void LaneClientEnd::Sleep(uint32_t seen, absl::Duration timeout) {
  std::atomic_ref<uint32_t>(*w_.clients_sleeping).fetch_add(1, std::memory_order_seq_cst);
  if (!HasInput() && state() == kStateOpen) FutexWait(w_.client_doorbell, seen, timeout);
  std::atomic_ref<uint32_t>(*w_.clients_sleeping).fetch_sub(1, std::memory_order_seq_cst);
}

void LaneClientEnd::WakeAll() { Ding(w_.client_doorbell); }

uint32_t LaneClientEnd::state() const { return Load32(w_.state); }

}  // namespace expertd::lane
