// The core-only build (the Windows cross-build) has no client library, so expertctl has only
// its file tools there: no command talks to a daemon.
#include "commands.h"

namespace expertd::ctl {

void AddServiceCommands(CLI::App& /*app*/, int* /*exit_code*/) {}

}  // namespace expertd::ctl
