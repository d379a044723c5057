// Shared by the index tools: the model named by one or more --gguf arguments.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/gguf_model.h"

namespace expertd::ctl {

// Opens the model of the first path (finding all shards of a split model); every further path
// must be one of its shards, so `--gguf a-00001-of-00002.gguf --gguf a-00002-of-00002.gguf` and
// `--gguf a-00001-of-00002.gguf` name the same model.
absl::StatusOr<GgufModel> OpenModelArgs(const std::vector<std::string>& paths);

// Prints "expertctl CMD: message" to stderr.
void PrintError(const char* command, const absl::Status& status);

}  // namespace expertd::ctl
