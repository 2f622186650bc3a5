#include "report/ptx_census.h"

#include <cctype>

namespace lunajit::report {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// The body of `.entry name(...) { ... }`: from the entry's first '{' to its
// matching '}'.
std::string_view entry_body(std::string_view ptx, std::string_view name) {
  size_t pos = 0;
  while ((pos = ptx.find(".entry ", pos)) != std::string_view::npos) {
    pos += 7;
    size_t start = pos;
    while (start < ptx.size() && ptx[start] == ' ') ++start;
    size_t end = start;
    while (end < ptx.size() && ptx[end] != '(' && !std::isspace(static_cast<unsigned char>(ptx[end]))) ++end;
    if (ptx.substr(start, end - start) != name) continue;
    const size_t open = ptx.find('{', end);
    if (open == std::string_view::npos) return {};
    int depth = 0;
    for (size_t i = open; i < ptx.size(); ++i) {
      if (ptx[i] == '{') ++depth;
      else if (ptx[i] == '}' && --depth == 0) return ptx.substr(open + 1, i - open - 1);
    }
    return ptx.substr(open + 1);
  }
  return {};
}

}  // namespace

nlohmann::json PtxCensus::to_json() const {
  return {{"mma", mma},           {"fma", fma},           {"ld_shared", ld_shared}, {"st_shared", st_shared},
          {"ld_global", ld_global}, {"st_global", st_global}, {"cp_async", cp_async},   {"ldmatrix", ldmatrix},
          {"sfu", sfu}};
}

PtxCensus ptx_census(std::string_view ptx, std::string_view lowered_name) {
  PtxCensus c;
  const std::string_view body = entry_body(ptx, lowered_name);
  if (body.empty()) return c;
  c.found = true;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t nl = body.find('\n', pos);
    if (nl == std::string_view::npos) nl = body.size();
    std::string_view line = body.substr(pos, nl - pos);
    pos = nl + 1;
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) line.remove_prefix(1);
    if (line.empty() || starts_with(line, "//") || line.front() == '.' || line.front() == '$' ||
        line.front() == '{' || line.front() == '}')
      continue;
    if (line.front() == '@') {  // predicate guard
      const size_t sp = line.find_first_of(" \t");
      if (sp == std::string_view::npos) continue;
      line.remove_prefix(sp);
      while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) line.remove_prefix(1);
    }
    const std::string_view op = line.substr(0, line.find_first_of(" \t;"));
    if (starts_with(op, "mma.") || starts_with(op, "wgmma.mma_async")) ++c.mma;
    else if (starts_with(op, "fma.")) ++c.fma;
    else if (starts_with(op, "ld.shared") || starts_with(op, "ld.volatile.shared")) ++c.ld_shared;
    else if (starts_with(op, "st.shared")) ++c.st_shared;
    else if (starts_with(op, "ld.global")) ++c.ld_global;
    else if (starts_with(op, "st.global")) ++c.st_global;
    else if (starts_with(op, "ldmatrix.")) ++c.ldmatrix;
    else if (starts_with(op, "cp.async.") && !starts_with(op, "cp.async.commit_group") &&
             !starts_with(op, "cp.async.wait_group") && !starts_with(op, "cp.async.wait_all") &&
             !starts_with(op, "cp.async.bulk.commit_group") && !starts_with(op, "cp.async.bulk.wait_group"))
      ++c.cp_async;
    else if (starts_with(op, "ex2.") || starts_with(op, "lg2.") || starts_with(op, "rcp.") ||
             starts_with(op, "rsqrt.") || starts_with(op, "sqrt.") || starts_with(op, "sin.") ||
             starts_with(op, "cos.") || starts_with(op, "tanh."))
      ++c.sfu;
  }
  return c;
}

}  // namespace lunajit::report
