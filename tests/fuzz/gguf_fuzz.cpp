// Fuzz target for the GGUF header reader. Any input must either be rejected with an error that
// names the source, or be accepted with a self-consistent header: tensors inside the file, data
// packed and aligned, sizes matching the type table.
#include <cstdint>
#include <span>

#include "format/gguf.h"
#include "util/checked.h"

namespace {
void Check(bool ok) {
  if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using expertd::GgufFile;
  const auto f = GgufFile::ParseBytes(std::span(data, size), "fuzz.gguf");
  if (!f.ok()) {
    Check(f.status().message().find("fuzz.gguf") == 0);
    return 0;
  }
  Check(expertd::IsPowerOfTwo(f->alignment()));
  Check(f->data_offset() % f->alignment() == 0);
  uint64_t expected = 0;
  for (const auto& t : f->tensors()) {
    Check(t.n_dims <= 4);
    Check(t.name.size() < 64);
    Check(t.offset == expected);
    Check(t.file_offset == f->data_offset() + t.offset);
    Check(expertd::RangeInside(t.file_offset, t.nbytes, size));
    Check(t.ne[0] % t.type.block_elements == 0);
    expected += *expertd::CheckedAlignUp(t.nbytes, f->alignment());
  }
  Check(expected == f->data_size());
  for (const auto& kv : f->kvs()) {
    if (kv.type == expertd::GgufType::kArray) {
      Check(kv.array.elements.size() <= kv.array.count);
    }
  }
  return 0;
}
