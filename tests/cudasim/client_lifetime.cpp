// What a CUDA session opens in the client's process, and when it is closed again (the client
// library's contract, device/cuda_factory.h and client.h): each arena's IPC memory handle once
// per process however many sessions use it, every session's events, and nothing left open once
// the last session ended — counted by the CUDA simulator (expertd_cudasim_open_imports). The
// bytes every session reads are compared with the model file (GGUF) the daemon serves.
//   cudasim_client_lifetime ADDR GGUF TENSORS   against `expertd --demo` on cuda:0 (the
//       simulator's build), the demo's model file and its tensor offsets (see FromModelFile)
// Prints what it saw; exit 0 when every check held, 1 otherwise.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client.h"
#include "cudasim.h"
#include "util/file.h"
#include "util/hash.h"

namespace {

using expertd::client::Client;
using expertd::client::Session;

int failures = 0;

void Check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

std::pair<int, int> Imports() {
  int memory = 0;
  int events = 0;
  expertd_cudasim_open_imports(&memory, &events);
  return {memory, events};
}

std::unique_ptr<Session> Open(Client& client, const char* name) {
  expertd::client::SessionOptions o;
  o.model = "demo";
  o.client_name = name;
  auto s = client.OpenSession(o);
  if (!s.ok()) {
    std::printf("FAIL: OpenSession %s: %s\n", name, s.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(s);
}

// XXH3s of what the model file holds for experts 0 and 1 of the first MoE layer, projection by
// projection, in ReadLayer's order (empty on an error, which is reported). Tensor offsets come
// from `tensors` ("NAME ABSOLUTE_OFFSET" lines written by tests/support/gguf_tensors.py, a GGUF
// reader independent of the project's); an expert's part of a stacked tensor is expert_bytes
// long.
std::vector<uint64_t> FromModelFile(const expertd::v1::ModelInfo& model, const std::string& gguf,
                                    const std::string& tensors) {
  std::map<std::string, uint64_t> offsets;
  std::ifstream in(tensors);
  std::string name;
  uint64_t offset = 0;
  while (in >> name >> offset) offsets[name] = offset;
  auto file = expertd::ReadFile::Open(gguf);
  if (!file.ok()) return Check(false, file.status().ToString()), std::vector<uint64_t>{};
  const uint32_t layer = model.moe_layers(0);
  const expertd::v1::SlotClass* cls = nullptr;
  for (const auto& c : model.slot_classes()) {
    for (uint32_t l : c.layers()) {
      if (l == layer) cls = &c;
    }
  }
  if (cls == nullptr) return Check(false, "no slot class for the first layer"), std::vector<uint64_t>{};
  std::vector<uint64_t> sums;
  for (uint32_t expert : {0u, 1u}) {
    for (const auto& projection : cls->projections()) {
      const std::string tensor = absl::StrCat("blk.", layer, ".ffn_", projection.kind(), "_exps.weight");
      const auto it = offsets.find(tensor);
      if (it == offsets.end()) {
        return Check(false, absl::StrCat("no tensor ", tensor)), std::vector<uint64_t>{};
      }
      std::vector<uint8_t> bytes(projection.expert_bytes());
      if (absl::Status st = file->ReadAt(it->second + expert * bytes.size(), bytes); !st.ok()) {
        return Check(false, st.ToString()), std::vector<uint64_t>{};
      }
      sums.push_back(expertd::Xxh3(bytes));
    }
  }
  return sums;
}

// Acquires experts 0 and 1 of the model's first MoE layer, copies every projection back and
// returns their XXH3s (empty on an error, which is reported).
std::vector<uint64_t> ReadLayer(Session& s) {
  const uint32_t layer = s.info().model().moe_layers(0);
  const std::vector<uint32_t> experts = {0, 1};
  auto lease = s.Acquire(layer, experts);
  if (!lease.ok()) {
    Check(false, absl::StrCat("acquire: ", lease.status().ToString()));
    return {};
  }
  std::vector<uint64_t> sums;
  absl::Status st = s.WaitReady(*lease, nullptr);
  for (const auto& slot : lease->slots) {
    for (size_t p = 0; st.ok() && p < slot.device_projections.size(); ++p) {
      auto arena = s.arena(slot.slot_class, static_cast<uint32_t>(p));
      st = arena.status();
      if (!st.ok()) break;
      std::vector<uint8_t> bytes(arena->stride);
      st = s.CopySlot(slot, p, bytes, nullptr);
      const auto& projection = s.info().model().slot_classes(static_cast<int>(slot.slot_class))
                                   .projections(static_cast<int>(p));
      bytes.resize(std::min<uint64_t>(bytes.size(), projection.expert_bytes()));
      sums.push_back(expertd::Xxh3(bytes));
    }
  }
  if (st.ok()) st = s.RecordDone(*lease, nullptr);
  if (st.ok()) st = s.Release(*lease);
  if (!st.ok()) {
    Check(false, absl::StrCat("reading the layer: ", st.ToString()));
    return {};
  }
  return sums;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: cudasim_client_lifetime ADDR GGUF TENSORS\n");
    return 2;
  }
  expertd::client::ConnectOptions co;
  co.address = argv[1];
  auto client = Client::Connect(co);
  if (!client.ok()) {
    std::printf("FAIL: connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  Check(Imports() == std::make_pair(0, 0), "nothing imported before a session");

  auto a = Open(**client, "lifetime-a");
  const std::vector<uint64_t> want = FromModelFile(a->info().model(), argv[2], argv[3]);
  const auto [memory_a, events_a] = Imports();
  const std::vector<uint64_t> first = ReadLayer(*a);
  Check(memory_a > 0 && events_a > 0,
        absl::StrCat("session a: ", memory_a, " arenas and ", events_a, " events open"));
  Check(!first.empty() && first == want,
        absl::StrCat("session a read ", first.size(), " projections, equal to the model file's ",
                     want.size()));

  auto b = Open(**client, "lifetime-b");
  const auto [memory_ab, events_ab] = Imports();
  Check(memory_ab == memory_a,
        absl::StrCat("a second session opens no arena again (", memory_ab, " open)"));
  // Session a opened one ready and one done event per slot; b opens only its own done events:
  // the ready events are the slot class's, opened once per process (CUDA documents
  // reference-counted re-opening for memory handles only).
  Check(events_a % 2 == 0 && events_ab - events_a == events_a / 2,
        absl::StrCat("the second session opens only its own done events (", events_ab,
                     " open; session a opened ", events_a, ")"));

  a.reset();  // ends session a; b still uses the same arenas
  const auto [memory_b, events_b] = Imports();
  Check(memory_b == memory_a,
        absl::StrCat("after a ended, its arenas stay open for b (", memory_b, " open)"));
  Check(events_b == events_ab - events_a / 2,
        absl::StrCat("after a ended, its ", events_a / 2, " done events are closed and the ready "
                     "events stay open for b (", events_b, " open)"));
  Check(ReadLayer(*b) == first, "session b reads the same bytes through the shared arenas");

  b.reset();
  Check(Imports() == std::make_pair(0, 0), "nothing left open after the last session ended");

  auto c = Open(**client, "lifetime-c");
  Check(ReadLayer(*c) == first, "a new session re-opens the arenas and reads the same bytes");
  c.reset();
  Check(Imports() == std::make_pair(0, 0), "nothing left open at the end");
  std::printf("%s (%d failure(s))\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
