// expertctl synth --preset NAME --out DIR [--seed S] [--split N] [--scale X]
#include <cstdio>
#include <memory>

#include "commands.h"
#include "progress.h"
#include "synth/synth.h"

namespace expertd::ctl {

void AddSynthCommand(CLI::App& app, int* exit_code) {
  std::string presets;
  for (const SynthPresetInfo& p : SynthPresets()) {
    presets += "\n  " + std::string(p.name) + ": " + std::string(p.description);
  }
  auto* cmd = app.add_subcommand(
      "synth", "Write a synthetic GGUF MoE model with deterministic content. Presets:" + presets);
  auto args = std::make_shared<SynthOptions>();
  auto quiet = std::make_shared<bool>(false);
  cmd->add_option("--preset", args->preset, "Model family to imitate")->required();
  cmd->add_option("--out", args->out_dir, "Output folder (model.gguf or shards)")->required();
  cmd->add_option("--seed", args->seed, "Content seed")->capture_default_str();
  cmd->add_option("--split", args->split, "Number of shards")->capture_default_str();
  cmd->add_option("--scale", args->scale, "Multiplier of each expert's width (and bytes)")
      ->capture_default_str();
  cmd->add_flag("--quiet", *quiet, "No progress output");
  cmd->callback([args, quiet, exit_code] {
    std::unique_ptr<Progress> progress;
    SynthOptions options = *args;
    options.progress = [&](uint64_t done, uint64_t total) {
      if (!progress) progress = std::make_unique<Progress>("synth " + args->preset, total, *quiet);
      progress->Update(done);
    };
    const absl::StatusOr<std::vector<std::string>> files = SynthesizeModel(options);
    if (progress) progress->Finish();
    if (!files.ok()) {
      std::fprintf(stderr, "expertctl synth: %s\n", std::string(files.status().message()).c_str());
      *exit_code = 2;
      return;
    }
    for (const std::string& f : *files) std::printf("%s\n", f.c_str());
    *exit_code = 0;
  });
}

}  // namespace expertd::ctl
