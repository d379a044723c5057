// Fuzz target: the daemon's reader of a session's request lane (LaneDaemonEnd, src/lane/lane.h)
// under a client that may write anything into the segment at any time. The input is a program
// of operations on one private lane:
//   0 n bytes...   copy n bytes into the request ring at the client's head, advance the head by
//                  n (or by any amount: the next byte)
//   1 u64          set the request head to any value
//   2              let the daemon read until the ring is empty or it refuses
//   3 ...          a valid acquire / prefetch / release written through the client's end
//   4 u64          set the response tail to any value, then the daemon writes an answer
//   5 n bytes...   decode n raw bytes as one request record
// Checks, beyond "no crash, no out-of-bounds access": every request the daemon accepts encodes
// back to exactly the bytes it read; once the daemon refused, it refuses for good; an answer
// is written only when the client's tail allows it.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "lane/lane.h"

namespace {

using expertd::lane::LaneClientEnd;
using expertd::lane::LaneDaemonEnd;
using expertd::lane::LaneGeometry;

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool empty() const { return p_ == end_; }
  uint8_t Byte() { return p_ == end_ ? 0 : *p_++; }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{Byte()} << (8 * i);
    return v;
  }
  size_t Take(size_t n, const uint8_t** out) {
    n = std::min<size_t>(n, static_cast<size_t>(end_ - p_));
    *out = p_;
    p_ += n;
    return n;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

void Check(bool ok) {
  if (!ok) std::abort();
}

std::vector<uint8_t> Encode(const expertd::lane::Request& r) {
  std::vector<uint8_t> out;
  using expertd::lane::RecordType;
  if (r.type == RecordType::kAcquire) {
    Check(expertd::lane::EncodeAcquire(r.seq, r.layer, r.experts, &out).ok());
  } else if (r.type == RecordType::kPrefetch) {
    Check(expertd::lane::EncodePrefetch(r.groups, &out).ok());
  } else {
    Check(expertd::lane::EncodeRelease(r.seq, r.leases, &out).ok());
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  LaneGeometry g;
  g.request_bytes = 64 << 10;
  g.response_bytes = 64 << 10;
  std::vector<uint64_t> words(g.segment_bytes() / 8, 0);
  uint8_t* base = reinterpret_cast<uint8_t*>(words.data());
  auto daemon = LaneDaemonEnd::Format(base, g);
  Check(daemon.ok());
  auto client = LaneClientEnd::Attach(base, g.segment_bytes(), g);
  Check(client.ok());
  uint64_t& head = words[64 / 8];
  uint64_t& tail = words[128 / 8];  // the daemon's published request tail
  uint64_t& response_tail = words[320 / 8];
  uint8_t* ring = base + expertd::lane::kRingsOffset;

  Input in(data, size);
  bool refused = false;
  for (int ops = 0; !in.empty() && ops < 256; ++ops) {
    switch (in.Byte() % 6) {
      case 0: {
        const uint8_t* bytes;
        const size_t n = in.Take(in.Byte() * 4u, &bytes);
        const uint64_t pos = head % g.request_bytes;
        const size_t fit = std::min<uint64_t>(n, g.request_bytes - pos);
        std::memcpy(ring + pos, bytes, fit);
        head += in.Byte() % 2 ? n : in.Byte();
        break;
      }
      case 1:
        head = in.U64();
        break;
      case 2:
        for (int k = 0; k < 64; ++k) {
          expertd::lane::Request r;
          bool got = false;
          const uint64_t before = tail;
          const absl::Status st = daemon->Next(&r, &got);
          if (!st.ok()) {
            Check(!got && st.code() != absl::StatusCode::kOk);
            refused = true;
            break;
          }
          Check(!refused);  // never accepts again after a refusal
          if (!got) break;
          // What it accepted is exactly what the record said, nothing more or less.
          const std::vector<uint8_t> again = Encode(r);
          Check(tail > before && tail - before >= again.size());
          const uint64_t at = (tail - again.size()) % g.request_bytes;
          Check(std::memcmp(ring + at, again.data(), again.size()) == 0);
        }
        break;
      case 3: {
        std::vector<uint8_t> rec;
        const uint8_t kind = in.Byte() % 3;
        std::vector<uint32_t> experts(in.Byte() % 70);
        for (uint32_t& e : experts) e = in.Byte();
        if (kind == 0) {
          (void)expertd::lane::EncodeAcquire(in.U64(), in.Byte(), experts, &rec);
        } else if (kind == 1) {
          std::vector<expertd::lane::PrefetchGroup> groups(in.Byte() % 8);
          for (auto& grp : groups) grp = {in.Byte(), experts};
          (void)expertd::lane::EncodePrefetch(groups, &rec);
        } else {
          std::vector<uint64_t> leases(in.Byte() % 20, in.U64());
          (void)expertd::lane::EncodeRelease(in.U64(), leases, &rec);
        }
        if (!rec.empty()) (void)client->Write(rec);
        break;
      }
      case 4: {
        response_tail = in.Byte() % 2 ? in.U64() : response_tail;
        std::vector<uint8_t> rec;
        Check(expertd::lane::EncodeError(in.U64(), 3, "bad", &rec).ok());
        (void)daemon->Write(rec);
        break;
      }
      case 5: {
        const uint8_t* bytes;
        const size_t n = in.Take(in.Byte() * 2u, &bytes);
        std::vector<uint8_t> copy(bytes, bytes + n);
        auto r = expertd::lane::DecodeRequest(copy);
        if (r.ok()) Check(Encode(*r) == copy);  // a record decodes only if it is canonical
        break;
      }
    }
  }
  return 0;
}
