// The request lane (src/lane/lane.h): the record format against the contract in
// docs/protocol.md, both ends of the rings in one process over private memory (wrap-around, a
// full lane, a write that does not wake the daemon, every malformed input the daemon must
// refuse), then the daemon's lane thread with real sessions (lane_server.h): answers out of
// order, several requests outstanding, a client that stops reading, one that writes garbage, one
// that vanishes with requests in its lane.
#include "lane/lane.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "device/host/host_device.h"
#include "lane_server.h"
#include "sessions.h"
#include "support/session_done.h"
#include "support/test_support.h"
#include "synth/synth.h"

namespace expertd {
namespace {

using lane::LaneClientEnd;
using lane::LaneDaemonEnd;
using lane::LaneGeometry;
using lane::RecordType;

// A lane segment in private memory, formatted by the daemon's end.
struct PrivateLane {
  explicit PrivateLane(LaneGeometry g = {}) : geometry(g), words(g.segment_bytes() / 8, 0) {
    auto d = LaneDaemonEnd::Format(base(), g);
    EXPECT_TRUE(d.ok()) << d.status();
    daemon = std::make_unique<LaneDaemonEnd>(*std::move(d));
    auto c = LaneClientEnd::Attach(base(), g.segment_bytes(), g);
    EXPECT_TRUE(c.ok()) << c.status();
    client = std::make_unique<LaneClientEnd>(*std::move(c));
  }
  uint8_t* base() { return reinterpret_cast<uint8_t*>(words.data()); }
  uint64_t& at(uint64_t offset) { return words[offset / 8]; }
  uint8_t* request_ring() { return base() + lane::kRingsOffset; }

  LaneGeometry geometry;
  std::vector<uint64_t> words;
  std::unique_ptr<LaneDaemonEnd> daemon;
  std::unique_ptr<LaneClientEnd> client;
};

std::vector<uint8_t> Acquire(uint64_t seq, uint32_t layer, std::vector<uint32_t> experts) {
  std::vector<uint8_t> out;
  EXPECT_TRUE(lane::EncodeAcquire(seq, layer, experts, &out).ok());
  return out;
}

// ---- The record format -----------------------------------------------------------------------

TEST(LaneRecords, AcquireBytesFollowTheDocumentedLayout) {
  // docs/protocol.md: head {u32 size, u16 type, u16 count, u64 seq}, then u32 layer, u32 0 and
  // the experts, padded to 16 bytes. Built here by hand, field by field.
  std::vector<uint8_t> want(48, 0);
  const uint32_t size = 48, layer = 7, experts[5] = {1, 2, 3, 4, 5};
  const uint16_t type = 1, count = 5;
  const uint64_t seq = 0x0102030405060708;
  std::memcpy(&want[0], &size, 4);
  std::memcpy(&want[4], &type, 2);
  std::memcpy(&want[6], &count, 2);
  std::memcpy(&want[8], &seq, 8);
  std::memcpy(&want[16], &layer, 4);
  std::memcpy(&want[24], experts, sizeof experts);
  EXPECT_EQ(Acquire(seq, 7, {1, 2, 3, 4, 5}), want);
}

TEST(LaneRecords, EveryTypeRoundTrips) {
  std::vector<uint8_t> buf;
  const std::vector<lane::PrefetchGroup> groups = {{3, {1, 2, 3}}, {4, {}}, {5, {7}}};
  ASSERT_TRUE(lane::EncodePrefetch(groups, &buf).ok());
  auto p = lane::DecodeRequest(buf);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->groups.size(), 3u);
  EXPECT_EQ(p->groups[0].experts, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_TRUE(p->groups[1].experts.empty());
  EXPECT_EQ(p->groups[2].layer, 5u);

  buf.clear();
  const uint64_t leases[] = {9, 10, 11};
  ASSERT_TRUE(lane::EncodeRelease(44, leases, &buf).ok());
  auto r = lane::DecodeRequest(buf);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type, RecordType::kRelease);
  EXPECT_EQ(r->seq, 44u);
  EXPECT_EQ(r->leases, (std::vector<uint64_t>{9, 10, 11}));

  buf.clear();
  lane::Response g;
  g.type = RecordType::kGrant;
  g.seq = 5;
  g.lease = 77;
  g.layer = 2;
  g.stall_ns = 1234;
  g.slots = {{3, 0, 12, true, 40}, {5, 1, 0, false, 1ull << 40}};
  ASSERT_TRUE(lane::EncodeGrant(g, &buf).ok());
  auto gd = lane::DecodeResponse(buf);
  ASSERT_TRUE(gd.ok()) << gd.status();
  EXPECT_EQ(gd->lease, 77u);
  EXPECT_EQ(gd->stall_ns, 1234u);
  ASSERT_EQ(gd->slots.size(), 2u);
  EXPECT_TRUE(gd->slots[0].hit);
  EXPECT_EQ(gd->slots[1].generation, 1ull << 40);

  buf.clear();
  ASSERT_TRUE(lane::EncodeError(6, 5, std::string(5000, 'x'), &buf).ok());
  auto e = lane::DecodeResponse(buf);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->code, 5);
  EXPECT_EQ(e->message.size(), 1024u);  // cut to the documented maximum

  // A request decoder refuses answers and the other way round.
  EXPECT_FALSE(lane::DecodeRequest(buf).ok());
  EXPECT_FALSE(lane::DecodeResponse(Acquire(1, 0, {1})).ok());
}

TEST(LaneRecords, MalformedRequestsAreRefusedNamingWhy) {
  std::vector<uint8_t> a = Acquire(1, 0, {1, 2, 3});  // 16 + 8 + 12 -> 48 bytes
  ASSERT_EQ(a.size(), 48u);
  auto broken = [&](auto mutate) {
    std::vector<uint8_t> b = a;
    mutate(b);
    return lane::DecodeRequest(b).status();
  };
  // A count that does not fit the size, in both directions.
  auto more = broken([](std::vector<uint8_t>& b) { b[6] = 9; });
  EXPECT_EQ(more.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(more.message().find("too short for 9 experts"), std::string::npos) << more;
  // Fewer experts than the size holds: the rest would be padding, and must be zeros.
  auto fewer = broken([](std::vector<uint8_t>& b) { b[6] = 1; });
  EXPECT_NE(fewer.message().find("nonzero padding"), std::string::npos) << fewer;
  std::vector<uint8_t> zeros = Acquire(1, 0, std::vector<uint32_t>(7, 0));  // 52 -> 64 bytes
  zeros[6] = 1;
  auto shorter = lane::DecodeRequest(zeros).status();
  EXPECT_NE(shorter.message().find("counts describe 32 bytes"), std::string::npos) << shorter;
  // A size field that disagrees with the record, a nonzero reserved field, an unknown type.
  EXPECT_FALSE(broken([](std::vector<uint8_t>& b) { b[0] = 64; }).ok());
  EXPECT_FALSE(broken([](std::vector<uint8_t>& b) { b[20] = 1; }).ok());
  EXPECT_FALSE(broken([](std::vector<uint8_t>& b) { b[4] = 9; }).ok());
  // A prefetch group claiming more experts than the record holds.
  std::vector<uint8_t> p;
  const std::vector<lane::PrefetchGroup> one = {{1, {1, 2}}};
  ASSERT_TRUE(lane::EncodePrefetch(one, &p).ok());
  p[20] = 0xff;
  EXPECT_FALSE(lane::DecodeRequest(p).ok());
  // Too big to encode.
  std::vector<uint8_t> big;
  EXPECT_FALSE(lane::EncodeAcquire(1, 0, std::vector<uint32_t>(5000, 1), &big).ok());
  EXPECT_TRUE(big.empty());
}

// ---- Both ends over private memory ----------------------------------------------------------

TEST(LaneRings, RecordsOfEverySizeWrapAroundInOrder) {
  PrivateLane l;
  std::mt19937 rng(7);
  uint64_t written = 0, read = 0;
  // Over 20 trips around the request ring, with sizes that leave every possible gap at the end.
  while (read < 3000) {
    for (int burst = rng() % 8; burst >= 0; --burst) {
      std::vector<uint32_t> experts(rng() % 300, static_cast<uint32_t>(written));
      if (!l.client->Write(Acquire(written + 1, written % 1000, experts))) break;
      ++written;
    }
    lane::Request r;
    bool got = false;
    while (true) {
      ASSERT_TRUE(l.daemon->Next(&r, &got).ok());
      if (!got) break;
      ++read;
      ASSERT_EQ(r.seq, read);  // in order, nothing lost or duplicated
      ASSERT_EQ(r.layer, (read - 1) % 1000);
      for (uint32_t e : r.experts) ASSERT_EQ(e, read - 1);
    }
  }
  EXPECT_EQ(read, written);
  EXPECT_GT(l.daemon->counters().bytes_in, 20 * l.geometry.request_bytes);
}

TEST(LaneRings, AFullLaneRefusesUntilTheOtherSideReads) {
  PrivateLane l;
  const std::vector<uint32_t> experts(1000, 1);  // 4,032-byte records
  int fitted = 0;
  while (l.client->Write(Acquire(fitted + 1, 0, experts))) ++fitted;
  EXPECT_EQ(fitted, static_cast<int>(l.geometry.request_bytes / 4032));
  lane::Request r;
  bool got = false;
  ASSERT_TRUE(l.daemon->Next(&r, &got).ok());
  ASSERT_TRUE(got);
  EXPECT_TRUE(l.client->Write(Acquire(99, 0, experts)));  // one record's room again

  // The response ring the same way, from the daemon's side.
  lane::Response g;
  g.type = RecordType::kGrant;
  g.slots.assign(600, {});
  std::vector<uint8_t> rec;
  ASSERT_TRUE(lane::EncodeGrant(g, &rec).ok());
  int answers = 0;
  for (;;) {
    auto w = l.daemon->Write(rec);
    ASSERT_TRUE(w.ok());
    if (!*w) break;
    ++answers;
  }
  EXPECT_EQ(answers, static_cast<int>(l.geometry.response_bytes / rec.size()));
  lane::Response out;
  ASSERT_TRUE(l.client->Next(&out, &got).ok());
  ASSERT_TRUE(got);
  EXPECT_EQ(out.slots.size(), 600u);
  auto again = l.daemon->Write(rec);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again);
}

// What a hostile client can do to the words and the ring it shares with the daemon.
TEST(LaneRings, ImpossibleIndicesAndRecordsFailTheLane) {
  const uint64_t kHead = 64;
  struct Case {
    const char* what;
    std::function<void(PrivateLane&)> mutate;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"head beyond the ring", [&](PrivateLane& l) { l.at(kHead) = l.geometry.request_bytes + 16; },
       "ahead in a ring"},
      {"head inside a record",
       [&](PrivateLane& l) {
         ASSERT_TRUE(l.client->Write(Acquire(1, 0, {1})));
         l.at(kHead) = 8;
       },
       "ends inside a record"},
      {"size not a multiple of 16",
       [&](PrivateLane& l) {
         ASSERT_TRUE(l.client->Write(Acquire(1, 0, {1})));
         l.request_ring()[0] = 24;
       },
       "has size 24"},
      {"size past what was published",
       [&](PrivateLane& l) {
         ASSERT_TRUE(l.client->Write(Acquire(1, 0, {1})));
         l.request_ring()[0] = 64;
       },
       "has size 64"},
      {"zero size",
       [&](PrivateLane& l) {
         l.at(kHead) = 32;
       },
       "has size 0"},
      {"unknown type",
       [&](PrivateLane& l) {
         ASSERT_TRUE(l.client->Write(Acquire(1, 0, {1})));
         l.request_ring()[4] = 0x81;
       },
       "not a request type"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    PrivateLane l;
    c.mutate(l);
    lane::Request r;
    bool got = true;
    absl::Status st = l.daemon->Next(&r, &got);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(c.message), std::string::npos) << st;
    EXPECT_FALSE(got);
    // Failed for good: a later, valid-looking state does not revive it.
    EXPECT_FALSE(l.daemon->Next(&r, &got).ok());
  }
  // The head moving back after the daemon consumed a record.
  PrivateLane back;
  ASSERT_TRUE(back.client->Write(Acquire(1, 0, {1})));
  lane::Request r;
  bool got = false;
  ASSERT_TRUE(back.daemon->Next(&r, &got).ok());
  back.at(kHead) = 0;
  absl::Status st = back.daemon->Next(&r, &got);
  EXPECT_NE(st.message().find("moved back"), std::string::npos) << st;

  // The response tail: moved past what the daemon wrote, or back.
  PrivateLane tail;
  std::vector<uint8_t> rec;
  ASSERT_TRUE(lane::EncodeLeaseExpired(1, &rec).ok());
  ASSERT_TRUE(*tail.daemon->Write(rec));
  tail.at(320) = 4096;
  EXPECT_EQ(tail.daemon->Write(rec).status().code(), absl::StatusCode::kInvalidArgument);
  tail.at(320) = 16;
  ASSERT_TRUE(tail.daemon->Write(rec).ok());
  tail.at(320) = 0;
  EXPECT_FALSE(tail.daemon->Write(rec).ok());
}

TEST(LaneRings, ASleepingDaemonThreadWakesForTheNextRequest) {
  PrivateLane l;
  std::atomic<bool> stop{false};
  std::atomic<int> seen{0};
  std::thread daemon([&] {
    lane::Request r;
    bool got = false;
    while (!stop.load()) {
      ASSERT_TRUE(l.daemon->Next(&r, &got).ok());
      if (got) {
        ++seen;
        continue;
      }
      l.daemon->Sleep(absl::InfiniteDuration(), stop);
    }
  });
  for (int i = 1; i <= 200; ++i) {
    while (!l.client->Write(Acquire(i, 0, {1}))) std::this_thread::yield();
    if (i % 20 == 0) absl::SleepFor(absl::Milliseconds(2));  // let it fall asleep now and then
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (seen.load() < 200 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(seen.load(), 200);
  EXPECT_GT(l.daemon->counters().sleeps, 0u);  // it did sleep, and every write woke it
  stop = true;
  l.daemon->Ring();
  daemon.join();
}

TEST(LaneRings, AWriteWithoutWakeWaitsForTheNextRungWriteOrFlush) {
  PrivateLane l;
  auto* doorbell = reinterpret_cast<uint32_t*>(l.base() + 192);
  auto* sleeping = doorbell + 1;
  *sleeping = 1;  // as LaneDaemonEnd::Sleep marks it
  std::vector<uint8_t> release;
  const uint64_t leases[] = {7};
  ASSERT_TRUE(lane::EncodeRelease(1, leases, &release).ok());
  const uint32_t before = *doorbell;
  ASSERT_TRUE(l.client->Write(release, /*wake=*/false));
  EXPECT_EQ(*doorbell, before) << "a write without wake rang the sleeping daemon";
  l.client->Flush();
  EXPECT_EQ(*doorbell, before + 1) << "Flush did not ring for the unread release";
  ASSERT_TRUE(l.client->Write(release, /*wake=*/false));
  ASSERT_TRUE(l.client->Write(Acquire(2, 0, {1})));
  EXPECT_EQ(*doorbell, before + 2) << "the acquire after it did not ring";
  // The daemon reads both in order: the release first.
  lane::Request r;
  bool got = false;
  for (uint64_t seq : {1, 1, 2}) {
    ASSERT_TRUE(l.daemon->Next(&r, &got).ok());
    ASSERT_TRUE(got);
    EXPECT_EQ(r.seq, seq);
  }
  ASSERT_TRUE(l.daemon->Next(&r, &got).ok());
  EXPECT_FALSE(got);
  l.client->Flush();
  EXPECT_EQ(*doorbell, before + 2) << "Flush rang with nothing unread";
  *sleeping = 0;
  ASSERT_TRUE(l.client->Write(release, /*wake=*/false));
  l.client->Flush();
  EXPECT_EQ(*doorbell, before + 2) << "Flush rang a daemon that is awake";
}

// ---- The daemon's lane thread with real sessions ---------------------------------------------

class NullOutbox final : public Outbox {
 public:
  bool Push(v1::SessionResponse) override { return true; }
};

class LaneSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthOptions so;
    so.preset = "mixtral-tiny";
    so.out_dir = dir_.path();
    auto written = SynthesizeModel(so);
    ASSERT_TRUE(written.ok()) << written.status();
    auto device = MakeHostDevice();
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = *std::move(device);
    EngineOptions eo;
    eo.slots_per_class = 16;
    eo.predictor = "none";
    auto model = ServedModel::Load({"m", written->front(), "", "", {}}, *device_, {}, eo);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    SessionLimits limits;
    limits.reap_interval = absl::Milliseconds(10);
    limits.lease_ttl = absl::Seconds(2);
    LaneOptions lanes;
    lanes.shm.shm_prefix = "expertd-lane-test";
    lanes.max_deferred = 64;
    registry_ = std::make_unique<SessionRegistry>(limits, lanes);
  }
  void TearDown() override {
    registry_.reset();
    model_.reset();
  }

  // A session with a lane, attached, and this process's client end of it.
  struct Opened {
    std::shared_ptr<Session> session;
    ShmMapping map;
    std::unique_ptr<LaneClientEnd> end;
    std::atomic<int> failures{0};
    absl::Status why;
  };
  std::unique_ptr<Opened> Open() {
    auto o = std::make_unique<Opened>();
    auto s = registry_->Open(model_.get(), peer_, "lane-test");
    EXPECT_TRUE(s.ok()) << s.status();
    o->session = *s;
    EXPECT_NE(o->session->lane(), nullptr);
    const v1::LaneHandle h = o->session->lane()->handle();
    SharedHandle sh;
    sh.kind = SharedHandle::Kind::kHostShm;
    sh.shm_name = h.memory().shm_name();
    sh.fd = h.memory().fd();
    sh.owner_pid = h.memory().owner_pid();
    sh.dev = h.memory().dev();
    sh.inode = h.memory().inode();
    auto map = MapSharedSegment(sh, h.segment_bytes());
    EXPECT_TRUE(map.ok()) << map.status();
    o->map = *std::move(map);
    LaneGeometry g;
    g.request_bytes = h.request_bytes();
    g.response_bytes = h.response_bytes();
    g.pin_words = h.pin_words();
    auto end = LaneClientEnd::Attach(o->map.data(), o->map.bytes(), g);
    EXPECT_TRUE(end.ok()) << end.status();
    o->end = std::make_unique<LaneClientEnd>(*std::move(end));
    Opened* raw = o.get();
    auto a = registry_->Attach(o->session->id(), peer_, std::make_shared<NullOutbox>(),
                               [raw](const absl::Status& why) {
                                 raw->why = why;
                                 ++raw->failures;
                               });
    EXPECT_TRUE(a.ok()) << a.status();
    return o;
  }
  // The next `n` answers, waiting up to 5 s.
  std::vector<lane::Response> Answers(LaneClientEnd& end, size_t n) {
    std::vector<lane::Response> out;
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (out.size() < n && absl::Now() < deadline) {
      lane::Response r;
      bool got = false;
      EXPECT_TRUE(end.Next(&r, &got).ok());
      if (got) {
        out.push_back(std::move(r));
      } else {
        end.Sleep(end.doorbell(), absl::Milliseconds(5));
      }
    }
    return out;
  }
  void Done(const Session& session, const lane::Response& g) {
    for (const auto& s : g.slots) {
      ASSERT_TRUE(testing::SignalDoneAsClient(session, s.slot_class, s.slot, s.generation).ok());
    }
  }

  testing::TempDir dir_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<ServedModel> model_;
  std::unique_ptr<SessionRegistry> registry_;
  Peer peer_{true, 1000, 1000, 0};
};

TEST_F(LaneSessionTest, SeveralOutstandingAcquiresAreAnsweredBySeqInAnyOrder) {
  auto o = Open();
  // Warm layer 0's experts 0..3 so later acquires of them hit while others miss.
  ASSERT_TRUE(o->end->Write(Acquire(1, 0, {0, 1, 2, 3})));
  auto warm = Answers(*o->end, 1);
  ASSERT_EQ(warm.size(), 1u);
  ASSERT_EQ(warm[0].type, RecordType::kGrant);
  Done(*o->session, warm[0]);
  const uint64_t lease0[] = {warm[0].lease};
  std::vector<uint8_t> rel;
  ASSERT_TRUE(lane::EncodeRelease(2, lease0, &rel).ok());
  ASSERT_TRUE(o->end->Write(rel));

  // Misses first, hits after: the hits' grants may overtake; each answer names its request.
  std::map<uint64_t, std::vector<uint32_t>> asked = {
      {10, {4, 5}}, {11, {6, 7}}, {12, {0, 1}}, {13, {2, 3}}, {14, {99}}};
  for (const auto& [seq, experts] : asked) ASSERT_TRUE(o->end->Write(Acquire(seq, 1 - (seq >= 12), experts)));
  auto answers = Answers(*o->end, asked.size());
  ASSERT_EQ(answers.size(), asked.size());
  std::set<uint64_t> seqs;
  for (const lane::Response& r : answers) {
    seqs.insert(r.seq);
    if (r.seq == 14) {  // expert 99 of 8: the request's own error, the lane goes on
      EXPECT_EQ(r.type, RecordType::kError);
      EXPECT_EQ(r.code, static_cast<int>(absl::StatusCode::kInvalidArgument));
      EXPECT_NE(r.message.find("out of range"), std::string::npos) << r.message;
      continue;
    }
    ASSERT_EQ(r.type, RecordType::kGrant) << r.seq << ": " << r.message;
    ASSERT_EQ(r.slots.size(), 2u);
    EXPECT_EQ(r.slots[0].expert, asked[r.seq][0]);
    EXPECT_EQ(r.slots[1].expert, asked[r.seq][1]);
  }
  EXPECT_EQ(seqs.size(), asked.size());
  EXPECT_EQ(o->failures.load(), 0);
  EXPECT_EQ(o->session->counters().leases_held, 4u);
  const v1::SessionStats st = o->session->Stats();
  EXPECT_EQ(st.transport(), "lane");
  EXPECT_EQ(st.lane().requests(), 7u);
  EXPECT_EQ(st.lane().responses(), 6u);  // the release has no answer
}

TEST_F(LaneSessionTest, OnePrefetchRecordCarriesSeveralLayersAndReleasesComeInBatches) {
  auto o = Open();
  const uint64_t issued_before = model_->engine().Stats().pool.prefetch_issued;
  // Three layers' hints in one record, one of them out of range (ignored, never an error).
  const std::vector<lane::PrefetchGroup> hints = {{1, {0, 1}}, {2, {2, 3}}, {999, {1}}};
  std::vector<uint8_t> rec;
  ASSERT_TRUE(lane::EncodePrefetch(hints, &rec).ok());
  ASSERT_TRUE(o->end->Write(rec));
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (model_->engine().Stats().pool.prefetch_issued < issued_before + 4 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(model_->engine().Stats().pool.prefetch_issued, issued_before + 4);

  // Two leases given back by one Release record.
  ASSERT_TRUE(o->end->Write(Acquire(1, 3, {0})));
  ASSERT_TRUE(o->end->Write(Acquire(2, 3, {1})));
  auto grants = Answers(*o->end, 2);
  ASSERT_EQ(grants.size(), 2u);
  std::vector<uint64_t> leases;
  for (const lane::Response& g : grants) {
    ASSERT_EQ(g.type, RecordType::kGrant) << g.message;
    Done(*o->session, g);
    leases.push_back(g.lease);
  }
  EXPECT_EQ(o->session->counters().leases_held, 2u);
  rec.clear();
  ASSERT_TRUE(lane::EncodeRelease(3, leases, &rec).ok());
  ASSERT_TRUE(o->end->Write(rec));
  while (o->session->counters().leases_held > 0 && absl::Now() < deadline + absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(o->session->counters().leases_held, 0u);
  EXPECT_EQ(o->failures.load(), 0);
}

TEST_F(LaneSessionTest, GarbageFailsThatSessionOnlyAndItsLeasesComeBack) {
  auto bad = Open();
  auto good = Open();
  ASSERT_TRUE(bad->end->Write(Acquire(1, 0, {1, 2})));
  auto held = Answers(*bad->end, 1);
  ASSERT_EQ(held.size(), 1u);
  ASSERT_EQ(held[0].type, RecordType::kGrant);
  // Garbage: a record whose size field points past everything published.
  std::vector<uint8_t> junk(64, 0xab);
  ASSERT_TRUE(bad->end->Write(junk));
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (bad->failures.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(bad->failures.load(), 1);
  EXPECT_EQ(bad->why.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad->why.message().find("lane"), std::string::npos) << bad->why;
  EXPECT_EQ(bad->end->state(), lane::kStateFailed);
  EXPECT_EQ(registry_->lane_failures(), 1u);
  // The stream's end (what the failure callback triggers in the service) ends the session; the
  // lease it held comes back once the client process is gone (here: after the TTL).
  registry_->End(bad->session);

  // The other session still works.
  ASSERT_TRUE(good->end->Write(Acquire(1, 2, {3})));
  auto g = Answers(*good->end, 1);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].type, RecordType::kGrant);
  EXPECT_EQ(good->failures.load(), 0);
  Done(*good->session, g[0]);
  const uint64_t lease[] = {g[0].lease};
  std::vector<uint8_t> rel;
  ASSERT_TRUE(lane::EncodeRelease(2, lease, &rel).ok());
  ASSERT_TRUE(good->end->Write(rel));
  const absl::Time drained = absl::Now() + absl::Seconds(10);
  while (registry_->LeasesOutstanding() > 0 && absl::Now() < drained) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(registry_->LeasesOutstanding(), 0u);
}

TEST_F(LaneSessionTest, AClientThatStopsReadingFailsWhenItsAnswersPileUp) {
  auto o = Open();
  // Every answer is an error record (~1 KiB with the message); nobody reads them.
  int sent = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (o->failures.load() == 0 && absl::Now() < deadline) {
    if (o->end->Write(Acquire(++sent, 999, {1}))) continue;
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(o->failures.load(), 1);
  EXPECT_EQ(o->why.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o->why.message().find("does not read its lane"), std::string::npos) << o->why;
  EXPECT_GT(o->session->lane()->Stats().deferred(), 0u);
}

TEST_F(LaneSessionTest, EndingWithRequestsStillInTheLaneLeavesNothingHeld) {
  auto o = Open();
  for (int i = 1; i <= 20; ++i) ASSERT_TRUE(o->end->Write(Acquire(i, i % 4, {0, 1})));
  // The client "dies": nobody releases or reads; the stream ends.
  registry_->End(o->session);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (registry_->LeasesOutstanding() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(registry_->LeasesOutstanding(), 0u);
  EXPECT_EQ(o->end->state(), lane::kStateClosed);
  EXPECT_EQ(registry_->size(), 0u);
}

}  // namespace
}  // namespace expertd
