// A subcommand a component file adds to the lunajit CLI: the CLI11 node (the
// caller checks `*cmd` after parsing) and what runs it (returns the exit code).
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace lunajit {

struct Subcommand {
  CLI::App* cmd = nullptr;
  std::function<int()> run;
};

}  // namespace lunajit
