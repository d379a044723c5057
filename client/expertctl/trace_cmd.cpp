// expertctl trace synth --preset NAME --out T.jsonl [--tokens N] [--seed S] [--layers N]
//                       [--zipf X] [--reuse P] [--correlation P]
// Writes a synthetic route trace (src/engine/trace_synth.h) for models without public traces.
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "engine/trace_synth.h"
#include "model_args.h"
#include "util/file.h"

namespace expertd::ctl {

void AddTraceCommands(CLI::App& app, int* exit_code) {
  auto* trace = app.add_subcommand("trace", "Route trace tools");
  trace->require_subcommand(1);
  std::string presets;
  for (const TraceSynthPreset& p : TraceSynthPresets()) {
    presets += "\n  " + std::string(p.name) + ": " + std::string(p.description);
  }
  auto* cmd = trace->add_subcommand(
      "synth",
      "Write a synthetic route trace (skewed popularity, reuse across tokens, correlation "
      "across layers; modelled, not measured). Presets:" +
          presets);
  auto o = std::make_shared<TraceSynthOptions>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("--preset", o->preset, "Model family")->required();
  cmd->add_option("--out", *out, "Trace file to write (JSONL)")->required();
  cmd->add_option("--tokens", o->tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed")->capture_default_str();
  cmd->add_option("--layers", o->layers, "MoE layers (default: the preset's)");
  cmd->add_option("--zipf", o->zipf, "Popularity exponent (default: the preset's)");
  cmd->add_option("--reuse", o->reuse, "P(a choice repeats the previous token's)");
  cmd->add_option("--correlation", o->correlation,
                  "P(a choice follows the layer below's through a fixed map)");
  cmd->callback([o, out, exit_code] {
    const absl::StatusOr<std::vector<RouteRecord>> records = SynthesizeRouteTrace(*o);
    absl::Status st = records.status();
    if (st.ok()) st = WriteTextFileAtomic(*out, FormatRouteTrace(*records));
    if (!st.ok()) {
      PrintError("trace synth", st);
      *exit_code = 2;
      return;
    }
    std::printf("%s: %zu records\n", out->c_str(), records->size());
    *exit_code = 0;
  });
}

}  // namespace expertd::ctl
