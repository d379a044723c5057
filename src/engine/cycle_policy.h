// The layer-aware eviction policy "cycle" (the default; docs/policy.md). Made through
// MakeEvictionPolicy; this header only connects the factory to its file.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/eviction_policy.h"

namespace expertd {

std::unique_ptr<EvictionPolicy> MakeCyclePolicy(const PolicyModel& model, uint32_t capacity);

}  // namespace expertd
