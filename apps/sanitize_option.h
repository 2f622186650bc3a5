// `lunajit run --sanitize LIST`: the host sanitizers (README "Host sanitizers")
// for the run, through LUNAJIT_HOST_SANITIZE, and the line that says which
// checks ran. Kept apart from lunajit_main.cpp so that file changes by two lines.
#pragma once

#include <functional>
#include <string>

namespace lunajit {

// Runs `run` with the sanitizers of `list` (empty: runs it as is). A list that
// does not parse, or a backend other than host/auto, exits 2 naming the word;
// "auto" becomes "host". A finding has failed the run with its message (exit
// 1); a clean run prints "sanitizers: <checks>: clean (N sanitized launches)".
int run_with_sanitize(const std::string& list, std::string& backend, const std::function<int()>& run);

}  // namespace lunajit
