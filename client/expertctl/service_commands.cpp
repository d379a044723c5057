// The service tools: commands that talk to a running daemon through the client library.
#include "commands.h"

namespace expertd::ctl {

void AddServiceCommands(CLI::App& app, int* exit_code) {
  AddHealthCommand(app, exit_code);
  AddStatsCommand(app, exit_code);
  AddBenchCommand(app, exit_code);
}

}  // namespace expertd::ctl
