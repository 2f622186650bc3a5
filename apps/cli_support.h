// What every lunajit command shares on the command line: 64-bit-safe number
// validators with messages that name the option and its range, --json on
// every command (before or after the command name), and "did you mean"
// suggestions for a mistyped command or option.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/input_limits.h"

namespace lunajit {

// Validates an integer option against `range` before CLI11 converts it:
// "--seq = 0: must be in [1, 2147483647]" instead of CLI11's float ranges.
CLI::Validator int_in(std::string_view option, limits::IntRange range);
// An unsigned 64-bit value (seeds): "-1" is an error, not 2^64 - 1.
CLI::Validator uint64_value(std::string_view option);

// Adds `--json` (bound to `flag`) to every subcommand, nested ones included,
// that does not have one yet.
void add_json_everywhere(CLI::App& app, bool& flag);

// Moves options that precede the command name (`lunajit --json run ...`) after
// it, so they reach the command whichever side they are written on.
std::vector<std::string> normalize_argv(const CLI::App& app, int argc, char** argv);

// The closest of `candidates` to `word` (edit distance at most 2, or a prefix
// match), or "" if none is close.
std::string closest(std::string_view word, const std::vector<std::string>& candidates);

// Parses; on a mistake prints the message, a suggestion where one is close,
// and returns the exit code (0 for --help/--version, 2 otherwise). -1: parsed.
int parse_command_line(CLI::App& app, std::vector<std::string> args);

}  // namespace lunajit
