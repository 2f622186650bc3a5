#include "apps/cli_support.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include <fmt/format.h>

namespace lunajit {

CLI::Validator int_in(std::string_view, limits::IntRange range) {
  return CLI::Validator(
      [range](std::string& value) -> std::string {
        // CLI11 puts the option's name in front of this message.
        auto r = limits::parse_int("value", value, range);
        return r ? std::string() : r.error().message;
      },
      fmt::format("INT in [{}, {}]", range.lo, range.hi));
}

CLI::Validator uint64_value(std::string_view) {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        auto r = limits::parse_uint64("value", value);
        return r ? std::string() : r.error().message;
      },
      "UINT64");
}

void add_json_everywhere(CLI::App& app, bool& flag) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    bool has = false;
    for (const CLI::Option* o : sub->get_options())
      if (o->check_lname("json")) has = true;
    if (!has) sub->add_flag("--json", flag, "machine-readable output");
    add_json_everywhere(*sub, flag);
  }
}

std::vector<std::string> normalize_argv(const CLI::App& app, int argc, char** argv) {
  std::vector<std::string> before, rest;
  int i = 1;
  // Flags written before the command name; --help and --version stay global.
  for (; i < argc && argv[i][0] == '-' && std::string_view(argv[i]) != "--help" &&
         std::string_view(argv[i]) != "-h" && std::string_view(argv[i]) != "--version";
       ++i)
    before.emplace_back(argv[i]);
  std::vector<std::string> out;
  if (i < argc) {
    out.emplace_back(argv[i++]);
    out.insert(out.end(), before.begin(), before.end());
  } else {
    out = before;
  }
  for (; i < argc; ++i) out.emplace_back(argv[i]);
  return out;
}

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(s->get_name());
  return names;
}

// The deepest subcommand that was named on the command line.
const CLI::App* active(const CLI::App& app) {
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
    if (s->parsed()) return active(*s);
  return &app;
}

}  // namespace

std::string closest(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = 3;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (word.size() >= 3 && c.rfind(word, 0) == 0) d = 0;  // a prefix: "tun" -> "tune", not "run"
    else if (c.size() >= 4 && word.rfind(c, 0) == 0) d = 1;  // an extension: "--seqlen" -> "--seq"
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

int parse_command_line(CLI::App& app, std::vector<std::string> args) {
  // A mistyped command name: CLI11 would only say that a subcommand is required.
  const std::vector<std::string> commands = command_names(app);
  const std::string prog = app.get_name().empty() ? "lunajit" : app.get_name();
  if (!commands.empty() && !args.empty() && args[0][0] != '-' &&
      std::find(commands.begin(), commands.end(), args[0]) == commands.end()) {
    const std::string guess = closest(args[0], commands);
    std::string all;
    for (const auto& c : commands) all += (all.empty() ? "" : ", ") + c;
    std::fprintf(stderr, "%s: unknown command '%s'%s; commands: %s (%s --help)\n", prog.c_str(),
                 limits::quote(args[0]).c_str(), guess.empty() ? "" : fmt::format("; did you mean '{}'?", guess).c_str(),
                 all.c_str(), prog.c_str());
    return 2;
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments reversed
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string hint;
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
      const CLI::App* cmd = active(app);
      std::vector<std::string> options;
      for (const CLI::Option* o : cmd->get_options())
        for (const auto& l : o->get_lnames()) options.push_back("--" + l);
      // The unexpected arguments are listed after the colon of CLI11's message.
      std::vector<std::string> extras;
      const std::string what = e.what();
      if (const size_t colon = what.find(": "); colon != std::string::npos) {
        std::istringstream words(what.substr(colon + 2));
        for (std::string w; words >> w;) extras.push_back(w);
      }
      for (const auto& extra : extras)
        if (extra.rfind("--", 0) == 0) {
          const std::string name = extra.substr(0, extra.find('='));
          if (const std::string g = closest(name, options); !g.empty())
            hint += fmt::format("; did you mean {} (for {})?", g, name);
        }
    }
    std::fprintf(stderr, "%s: %s%s\nRun with --help for more information.\n", prog.c_str(), e.what(), hint.c_str());
    return 2;
  }
  return -1;
}

}  // namespace lunajit
