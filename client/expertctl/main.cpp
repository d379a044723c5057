// expertctl: the operator's tool for expertd. The file tools (inspect, synth, index, replay,
// trace) work on files directly; the service tools (health, stats, bench) talk to a daemon and
// exist only where the client library is built (not in the core-only Windows build).
#include <cstdio>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"expertctl — tools for the expertd MoE expert-streaming daemon"};
  app.set_version_flag("--version", "expertctl " EXPERTD_VERSION);
  app.require_subcommand(1);
  int exit_code = 0;
  expertd::ctl::AddInspectCommand(app, &exit_code);
  expertd::ctl::AddSynthCommand(app, &exit_code);
  expertd::ctl::AddIndexCommands(app, &exit_code);
  expertd::ctl::AddReplayCommand(app, &exit_code);
  expertd::ctl::AddTraceCommands(app, &exit_code);
  expertd::ctl::AddServiceCommands(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}
