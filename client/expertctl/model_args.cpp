#include "model_args.h"

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace expertd::ctl {

absl::StatusOr<GgufModel> OpenModelArgs(const std::vector<std::string>& paths) {
  if (paths.empty()) return absl::InvalidArgumentError("no --gguf file given");
  ASSIGN_OR_RETURN(GgufModel model, GgufModel::Open(paths.front()));
  for (size_t i = 1; i < paths.size(); ++i) {
    bool found = false;
    std::error_code ec;
    for (const GgufFile& shard : model.shards()) {
      found = found || std::filesystem::equivalent(shard.path(), paths[i], ec);
    }
    if (!found) {
      return InvalidError(ErrorKind::kSplit,
                          absl::StrCat(paths[i], " is not a shard of the model opened from ",
                                       paths.front()));
    }
  }
  return model;
}

void PrintError(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "expertctl %s: %s\n", command, std::string(status.message()).c_str());
}

}  // namespace expertd::ctl
