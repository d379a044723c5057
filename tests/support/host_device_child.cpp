// The second process of device_test: a client of the host device in a process of its own. It
// maps an arena and a session's fences from the descriptors on its command line, waits for
// ready[SLOT] = 1, checks the slot's bytes (Pattern(SEED)) and the zero slot before it, stores
// done[SLOT] = 1, and with "readonly" checks that neither the arena nor the table can be opened
// for writing. The exit code says what failed (0: nothing).
//   host_device_child SLOT STRIDE SEED readonly|any ARENA(5) BYTES RESERVED
//                     TABLE(5) DONE(5) N_SLOTS DONE_OFFSET SEGMENT_BYTES
// where each handle is five arguments: NAME (- for none) FD OWNER_PID DEV INODE.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "device/host/host_device.h"
#include "support/host_device_args.h"

using expertd::testing::ParseHandle;
using expertd::testing::Pattern;

int main(int argc, char** argv) {
  if (argc != 1 + 4 + 5 + 2 + 5 + 5 + 3) return 2;
  int i = 1;
  const auto next = [&] { return std::string(argv[i++]); };
  const auto number = [&] { return std::strtoull(argv[i++], nullptr, 10); };
  const uint32_t slot = static_cast<uint32_t>(number());
  const uint64_t stride = number();
  const uint32_t seed = static_cast<uint32_t>(number());
  const bool readonly = next() == "readonly";
  expertd::ArenaExport arena;
  arena.handle = ParseHandle(argv + i);
  i += 5;
  arena.bytes = number();
  arena.reserved_bytes = number();
  expertd::FenceExport fences;
  fences.handle = ParseHandle(argv + i);
  i += 5;
  fences.session_done = ParseHandle(argv + i);
  i += 5;
  fences.n_slots = static_cast<uint32_t>(number());
  fences.done_offset = number();
  fences.segment_bytes = number();

  auto mapped_fences = expertd::MapFences(fences);
  if (!mapped_fences.ok()) return 10;
  auto mapped_arena = expertd::MapArena(arena);
  if (!mapped_arena.ok()) return 11;
  if (!mapped_fences->WaitReady(slot, 1, absl::Seconds(10)).ok()) return 12;
  const uint8_t* bytes = mapped_arena->data().data();
  for (uint64_t k = 0; k < stride; ++k) {
    if (bytes[slot * stride + k] != Pattern(seed, k)) return 13;
  }
  for (uint64_t k = 0; k < stride; ++k) {
    if (bytes[(slot - 1) * stride + k] != 0) return 14;
  }
  if (!mapped_fences->SignalDone(slot, 1).ok()) return 15;
  if (readonly) {
    if (expertd::MapSharedSegment(arena.handle, arena.reserved_bytes).ok()) return 16;
    if (expertd::MapSharedSegment(fences.handle, fences.segment_bytes).ok()) return 17;
  }
  return 0;
}
