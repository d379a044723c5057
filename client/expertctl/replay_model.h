// `expertctl replay --model DIR | --gguf F`: replays a route trace through the real engine on the
// host device — readers, staging, copies, slot pools — and checks every granted slot's bytes
// against the packs (XXH3), then reports hit rate, stalls and throughput.
#pragma once

#include <cstdint>
#include <string>

namespace expertd::ctl {

struct ReplayModelArgs {
  std::string trace;
  std::string model_dir;  // DIR/model.gguf, or the first shard in DIR
  std::string gguf;
  std::string index;      // optional index overlay
  std::string v1_q_pack;
  std::string policy = "cycle";
  std::string predictor = "none";
  std::string read_method = "pread";
  uint32_t capacity = 0;          // slots per slot class
  double capacity_fraction = 0;   // of each class's (layers x experts) bundles
  uint32_t reader_threads = 2;
  bool json = false;
};

int RunReplayWithModel(const ReplayModelArgs& args);

}  // namespace expertd::ctl
