#include "report/ptx_census.h"

#include <cctype>
#include <set>
#include <string>
#include <vector>

namespace lunajit::report {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && space(s[i])) ++i;
  return i;
}

// From an opening '(' at `i`: the index just past its matching ')'.
size_t skip_parens(std::string_view s, size_t i) {
  int depth = 0;
  for (; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    else if (s[i] == ')' && --depth == 0) return i + 1;
  }
  return s.size();
}

// The body of the definition `<directive> [(returns)] name(params) [performance
// directives] { ... }` of `name`, where directive is ".entry" or ".func": from
// its first '{' to the matching '}'. A declaration (a prototype ending in ';'
// before any '{') is passed over. Empty when there is no definition.
std::string_view definition_body(std::string_view ptx, std::string_view directive, std::string_view name) {
  size_t pos = 0;
  while ((pos = ptx.find(directive, pos)) != std::string_view::npos) {
    pos += directive.size();
    if (pos >= ptx.size() || !space(ptx[pos])) continue;  // ".entry" as part of a longer word
    size_t start = skip_space(ptx, pos);
    if (start < ptx.size() && ptx[start] == '(') start = skip_space(ptx, skip_parens(ptx, start));  // .func returns
    size_t end = start;
    while (end < ptx.size() && ptx[end] != '(' && ptx[end] != ';' && !space(ptx[end])) ++end;
    if (ptx.substr(start, end - start) != name) continue;
    const size_t open = ptx.find_first_of("{;", end);
    if (open == std::string_view::npos || ptx[open] == ';') continue;  // a declaration
    int depth = 0;
    for (size_t i = open; i < ptx.size(); ++i) {
      if (ptx[i] == '{') ++depth;
      else if (ptx[i] == '}' && --depth == 0) return ptx.substr(open + 1, i - open - 1);
    }
    return ptx.substr(open + 1);
  }
  return {};
}

// The callee of the call instruction that starts `text` ("call[.uni] [(ret),]
// name, (args);", possibly over several lines): the name, or "" for an
// indirect call through a register.
std::string callee(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && !space(text[i]) && text[i] != '(') ++i;  // the opcode
  i = skip_space(text, i);
  if (i < text.size() && text[i] == '(') {  // the return parameters
    i = skip_space(text, skip_parens(text, i));
    if (i < text.size() && text[i] == ',') i = skip_space(text, i + 1);
  }
  size_t end = i;
  while (end < text.size() && text[end] != ',' && text[end] != ';' && text[end] != '(' && !space(text[end])) ++end;
  const std::string_view name = text.substr(i, end - i);
  if (name.empty() || name.front() == '%') return {};
  return std::string(name);
}

// Adds the instructions of `body` to `c`; appends the direct callees to `calls`.
void count_body(std::string_view body, PtxCensus& c, std::vector<std::string>& calls) {
  size_t pos = 0;
  while (pos < body.size()) {
    size_t nl = body.find('\n', pos);
    if (nl == std::string_view::npos) nl = body.size();
    const size_t line_start = pos;
    std::string_view line = body.substr(pos, nl - pos);
    pos = nl + 1;
    size_t lead = 0;
    while (lead < line.size() && space(line[lead])) ++lead;
    line.remove_prefix(lead);
    if (line.empty() || starts_with(line, "//") || line.front() == '.' || line.front() == '$' ||
        line.front() == '{' || line.front() == '}')
      continue;
    size_t op_at = line_start + lead;
    if (line.front() == '@') {  // predicate guard
      const size_t sp = line.find_first_of(" \t");
      if (sp == std::string_view::npos) continue;
      size_t k = sp;
      while (k < line.size() && space(line[k])) ++k;
      line.remove_prefix(k);
      op_at += k;
    }
    const std::string_view op = line.substr(0, line.find_first_of(" \t;"));
    if (op == "call" || starts_with(op, "call.")) {
      const size_t semi = body.find(';', op_at);
      const std::string name = callee(body.substr(op_at, semi == std::string_view::npos ? std::string_view::npos
                                                                                     : semi - op_at));
      if (name.empty()) ++c.indirect_calls;
      else calls.push_back(name);
    } else if (starts_with(op, "mma.") || starts_with(op, "wgmma.mma_async")) ++c.mma;
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
}

}  // namespace

nlohmann::json PtxCensus::to_json() const {
  return {{"mma", mma},           {"fma", fma},           {"ld_shared", ld_shared}, {"st_shared", st_shared},
          {"ld_global", ld_global}, {"st_global", st_global}, {"cp_async", cp_async},   {"ldmatrix", ldmatrix},
          {"sfu", sfu},           {"functions", functions}, {"indirect_calls", indirect_calls}};
}

namespace {

// The entry's body and its reachable functions' bodies (see kernel_bodies);
// the census of them all in `c` when it is given.
std::vector<std::string_view> walk(std::string_view ptx, std::string_view lowered_name, PtxCensus* c) {
  std::vector<std::string_view> bodies;
  const std::string_view body = definition_body(ptx, ".entry", lowered_name);
  if (body.empty()) return bodies;
  PtxCensus scratch;
  PtxCensus& into = c ? *c : scratch;
  into.found = true;
  bodies.push_back(body);
  std::vector<std::string> pending;
  count_body(body, into, pending);
  std::set<std::string> seen;  // each function once, however many call sites (and no recursion loop)
  while (!pending.empty()) {
    const std::string name = std::move(pending.back());
    pending.pop_back();
    if (!seen.insert(name).second) continue;
    const std::string_view f = definition_body(ptx, ".func", name);
    if (f.empty()) continue;  // declared only (an extern the linker provides): nothing to count
    ++into.functions;
    bodies.push_back(f);
    count_body(f, into, pending);
  }
  return bodies;
}

}  // namespace

PtxCensus ptx_census(std::string_view ptx, std::string_view lowered_name) {
  PtxCensus c;
  walk(ptx, lowered_name, &c);
  return c;
}

std::vector<std::string_view> kernel_bodies(std::string_view ptx, std::string_view lowered_name) {
  return walk(ptx, lowered_name, nullptr);
}

}  // namespace lunajit::report
