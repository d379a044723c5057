// expertctl subcommands. Each Add*Command registers its subcommand on `app`; when it runs, it
// stores its process exit code in `*exit_code` (0 success, 1 the checked thing failed, 2 an
// error that stopped the command).
#pragma once

#include <CLI/CLI.hpp>

namespace expertd::ctl {

void AddInspectCommand(CLI::App& app, int* exit_code);
void AddSynthCommand(CLI::App& app, int* exit_code);
void AddIndexCommands(CLI::App& app, int* exit_code);
// Registers `verify` under the `index` subcommand (called by AddIndexCommands).
void AddIndexVerifyCommand(CLI::App& index, int* exit_code);
void AddReplayCommand(CLI::App& app, int* exit_code);
void AddTraceCommands(CLI::App& app, int* exit_code);
// Service tools: talk to a running daemon (daemon_args.h: --addr, --token-file, --timeout).
void AddHealthCommand(CLI::App& app, int* exit_code);
void AddStatsCommand(CLI::App& app, int* exit_code);
void AddBenchCommand(CLI::App& app, int* exit_code);
// health, stats and bench (service_commands.cpp); nothing where no client library is built
// (service_commands_none.cpp).
void AddServiceCommands(CLI::App& app, int* exit_code);

}  // namespace expertd::ctl
