#include "commands.h"
namespace expertd::ctl {
void AddTraceCommands(CLI::App&, int*) {}
}  // namespace expertd::ctl
