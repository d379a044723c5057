#include "commands.h"
namespace expertd::ctl {
void AddReplayCommand(CLI::App&, int*) {}
}  // namespace expertd::ctl
