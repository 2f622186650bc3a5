// compile_nvrtc: NVRTC program setup, resource parsing and the cached payload.
// Contract and option choices: runtime/nvrtc_compiler.h.
#include "runtime/nvrtc_compiler.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <nvrtc.h>
#include <sys/stat.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cache/binary_cache.h"
#include "common/hash.h"
#include "templates/embedded.h"

#ifndef LUNAJIT_VERSION
#define LUNAJIT_VERSION "unknown"
#endif

namespace lunajit {
namespace fs = std::filesystem;

namespace {

// Bumped whenever the cached payload layout or the option set changes meaning.
constexpr const char* kPayloadFormat = "lunajit-nvrtc-payload-1";

std::atomic<std::uint64_t> g_invocations{0};

// The embedded headers as NVRTC wants them: NUL-terminated contents and names,
// built once per process, plus the digest of all of them for cache keys.
struct HeaderSet {
  std::vector<std::string> names, contents;
  std::vector<const char*> name_ptrs, content_ptrs;
  std::string digest;
};

const HeaderSet& embedded_headers() {
  static const HeaderSet set = [] {
    HeaderSet s;
    Hasher h;
    auto add = [&](std::span<const EmbeddedFile> files) {
      for (const EmbeddedFile& f : files) {
        s.names.emplace_back(f.path);
        s.contents.emplace_back(f.contents);
        h.add(f.path).add(f.contents);
      }
    };
    add(templates::files());
    add(cuda_headers::files());
    for (std::size_t i = 0; i < s.names.size(); ++i) {
      s.name_ptrs.push_back(s.names[i].c_str());
      s.content_ptrs.push_back(s.contents[i].c_str());
    }
    s.digest = h.hex();
    return s;
  }();
  return set;
}

// GNU build id (hex) of the loaded object that holds `symbol`, read from its
// PT_NOTE segments in memory; empty if it has none.
std::string build_id_of(const void* symbol) {
  struct Search {
    std::uintptr_t addr;
    std::string id;
  } search{reinterpret_cast<std::uintptr_t>(symbol), {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* s = static_cast<Search*>(data);
        bool contains = false;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && s->addr >= lo && s->addr < lo + ph.p_memsz) contains = true;
        }
        if (!contains) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_NOTE) continue;
          const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
          const char* end = p + ph.p_memsz;
          while (p + sizeof(ElfW(Nhdr)) <= end) {
            const auto* n = reinterpret_cast<const ElfW(Nhdr)*>(p);
            const char* name = p + sizeof(ElfW(Nhdr));
            const char* desc = name + ((n->n_namesz + 3) & ~3u);
            if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
              static const char* hex = "0123456789abcdef";
              for (unsigned j = 0; j < n->n_descsz; ++j) {
                const auto b = static_cast<unsigned char>(desc[j]);
                s->id += hex[b >> 4];
                s->id += hex[b & 15];
              }
              return 1;
            }
            p = desc + ((n->n_descsz + 3) & ~3u);
          }
        }
        return 1;
      },
      &search);
  return search.id;
}

std::string program_log(nvrtcProgram prog) {
  size_t n = 0;
  if (nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n == 0) return {};
  std::string log(n, '\0');
  nvrtcGetProgramLog(prog, log.data());
  while (!log.empty() && log.back() == '\0') log.pop_back();
  return log;
}

std::string join(const std::vector<std::string>& v, const char* sep = " ") {
  std::string out;
  for (const auto& s : v) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

std::string file_name_for(const KernelSource& src) {
  std::string name = src.name.empty() ? "kernel_" + content_hash(src.code).substr(0, 8) : src.name;
  for (char& c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) c = '_';
  return name;
}

// Writes the failed source where a human can open it; returns the path or a note.
std::string dump_failed_source(const KernelSource& src) {
  std::error_code ec;
  const fs::path dir = fs::temp_directory_path(ec) / "lunajit-failed";
  fs::create_directories(dir, ec);
  const fs::path path = dir / (file_name_for(src) + ".cu");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << src.code;
  out.close();
  if (!out) return "(could not write " + path.string() + ")";
  return path.string();
}

nlohmann::json to_json(const KernelResources& r) {
  return {{"name_expression", r.name_expression}, {"lowered_name", r.lowered_name},
          {"registers", r.registers},             {"smem_bytes", r.smem_bytes},
          {"spill_stores", r.spill_stores},       {"spill_loads", r.spill_loads},
          {"stack_bytes", r.stack_bytes},         {"barriers", r.barriers},
          {"cmem", r.cmem}};
}

KernelResources resources_from_json(const nlohmann::json& j) {
  KernelResources r;
  r.name_expression = j.at("name_expression").get<std::string>();
  r.lowered_name = j.at("lowered_name").get<std::string>();
  r.registers = j.at("registers").get<int>();
  r.smem_bytes = j.at("smem_bytes").get<int>();
  r.spill_stores = j.at("spill_stores").get<int>();
  r.spill_loads = j.at("spill_loads").get<int>();
  r.stack_bytes = j.at("stack_bytes").get<int>();
  r.barriers = j.at("barriers").get<int>();
  r.cmem = j.at("cmem").get<int>();
  return r;
}

// Payload: u64 (little endian) JSON length, the JSON metadata, the CUBIN, the PTX.
std::string encode_payload(const CompiledKernel& k) {
  nlohmann::json meta = {{"format", kPayloadFormat},
                         {"lowered_names", k.lowered_names},
                         {"log", k.log},
                         {"options", k.options},
                         {"compile_seconds", k.compile_seconds},
                         {"cubin_bytes", k.cubin.size()},
                         {"ptx_bytes", k.ptx.size()}};
  auto& res = meta["resources"] = nlohmann::json::array();
  for (const auto& r : k.resources) res.push_back(to_json(r));
  const std::string text = meta.dump();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((std::uint64_t(text.size()) >> (8 * i)) & 0xff));
  out += text;
  out += k.cubin;
  out += k.ptx;
  return out;
}

std::optional<CompiledKernel> decode_payload(std::string_view p) {
  if (p.size() < 8) return std::nullopt;
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  if (n > p.size() - 8) return std::nullopt;
  try {
    const auto meta = nlohmann::json::parse(p.substr(8, n));
    if (meta.at("format").get<std::string>() != kPayloadFormat) return std::nullopt;
    const auto cubin_bytes = meta.at("cubin_bytes").get<std::uint64_t>();
    const auto ptx_bytes = meta.at("ptx_bytes").get<std::uint64_t>();
    if (8 + n + cubin_bytes + ptx_bytes != p.size()) return std::nullopt;
    CompiledKernel k;
    k.lowered_names = meta.at("lowered_names").get<std::map<std::string, std::string>>();
    k.log = meta.at("log").get<std::string>();
    k.options = meta.at("options").get<std::vector<std::string>>();
    for (const auto& r : meta.at("resources")) k.resources.push_back(resources_from_json(r));
    k.cubin.assign(p.substr(8 + n, cubin_bytes));
    k.ptx.assign(p.substr(8 + n + cubin_bytes, ptx_bytes));
    return k;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string cache_key(const KernelSource& src, const Arch& arch, const std::vector<std::string>& options,
                      bool with_ptx) {
  Hasher h;
  h.add(kPayloadFormat).add(LUNAJIT_VERSION).add(nvrtc_build_identity()).add(std::to_string(arch.sm));
  h.add(with_ptx ? "cubin+ptx" : "cubin");
  h.add(src.name).add(src.code).add(embedded_headers().digest);
  h.add(std::to_string(src.entries.size()));
  for (const auto& e : src.entries) h.add(e.name_expression);
  h.add(std::to_string(options.size()));
  for (const auto& o : options) h.add(o);
  return h.hex();
}

Error compile_error(const KernelSource& src, const Arch& arch, const std::vector<std::string>& options,
                    const std::string& what, const std::string& log) {
  std::ostringstream msg;
  msg << "NVRTC failed to compile " << file_name_for(src) << " for sm_" << arch.sm << " (NVRTC "
      << nvrtc_version() << "): " << what << "\n"
      << "options: " << join(options) << "\n"
      << "source: " << dump_failed_source(src) << "\n"
      << "log:\n"
      << log;
  return Error{ErrorKind::compile_failed, msg.str()};
}

// One NVRTC program; destroyed on every path out.
struct Program {
  nvrtcProgram handle = nullptr;
  ~Program() {
    if (handle) nvrtcDestroyProgram(&handle);
  }
};

}  // namespace

const KernelResources* CompiledKernel::find(std::string_view name_expression) const {
  for (const auto& r : resources)
    if (r.name_expression == name_expression) return &r;
  return nullptr;
}

std::vector<std::string> nvrtc_options(const Arch& arch, const NvrtcOptions& opts) {
  std::vector<std::string> o = {"--std=c++17", "--gpu-architecture=sm_" + std::to_string(arch.sm),
                                "-default-device", "-Xptxas=-v"};
  if (opts.line_info) o.push_back("-lineinfo");
  for (const auto& e : opts.extra) o.push_back(e);
  return o;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor);
}

std::string nvrtc_build_identity() {
  static const std::string identity = [] {
    const void* sym = reinterpret_cast<const void*>(&nvrtcVersion);
    if (std::string id = build_id_of(sym); !id.empty()) return nvrtc_version() + " build " + id;
    Dl_info info{};
    struct stat st {};
    if (dladdr(sym, &info) != 0 && info.dli_fname && ::stat(info.dli_fname, &st) == 0)
      return nvrtc_version() + " size " + std::to_string(st.st_size);
    return nvrtc_version();
  }();
  return identity;
}

std::vector<int> nvrtc_supported_sms() {
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return {};
  std::vector<int> sms(static_cast<std::size_t>(n));
  if (nvrtcGetSupportedArchs(sms.data()) != NVRTC_SUCCESS) return {};
  return sms;
}

std::uint64_t nvrtc_invocations() { return g_invocations.load(); }

std::map<std::string, KernelResources> parse_ptxas_resources(std::string_view log) {
  static const std::regex entry_re(R"(Compiling entry function '([^']+)')");
  static const std::regex props_re(R"(Function properties for ([^\s]+))");
  static const std::regex stack_re(R"((\d+) bytes stack frame)");
  static const std::regex spill_st_re(R"((\d+) bytes spill stores)");
  static const std::regex spill_ld_re(R"((\d+) bytes spill loads)");
  static const std::regex regs_re(R"(Used (\d+) registers)");
  static const std::regex bar_re(R"(used (\d+) barriers)");
  static const std::regex smem_re(R"((\d+) bytes smem)");
  static const std::regex cmem_re(R"((\d+) bytes cmem\[0\])");

  std::map<std::string, KernelResources> out;
  std::string entry;  // the entry function ptxas is compiling ("Used ..." belongs to it)
  std::string props;  // the function the next "stack frame" line describes
  std::istringstream lines{std::string(log)};
  std::string line;
  std::smatch m;
  auto number = [&](const std::regex& re, int& field) {
    if (std::regex_search(line, m, re)) field = std::stoi(m[1].str());
  };
  while (std::getline(lines, line)) {
    if (std::regex_search(line, m, entry_re)) {
      entry = m[1].str();
      out[entry].lowered_name = entry;
    } else if (std::regex_search(line, m, props_re)) {
      props = m[1].str();
    } else if (line.find("stack frame") != std::string::npos) {
      // Callees get their own "Function properties"; only entries are kept.
      if (auto it = out.find(props); it != out.end()) {
        number(stack_re, it->second.stack_bytes);
        number(spill_st_re, it->second.spill_stores);
        number(spill_ld_re, it->second.spill_loads);
      }
    } else if (line.find("Used ") != std::string::npos && !entry.empty()) {
      KernelResources& r = out[entry];
      number(regs_re, r.registers);
      number(bar_re, r.barriers);
      number(smem_re, r.smem_bytes);
      number(cmem_re, r.cmem);
    }
  }
  return out;
}

std::map<std::string, KernelUsage> usage_by_role(const KernelSource& src, const CompiledKernel& k) {
  std::map<std::string, KernelUsage> out;
  for (const auto& e : src.entries)
    if (const KernelResources* r = k.find(e.name_expression)) out[e.role] = {r->registers, r->smem_bytes};
  return out;
}

Result<CompiledKernel> compile_nvrtc(const KernelSource& src, const Arch& arch, const NvrtcOptions& opts) {
  const auto start = std::chrono::steady_clock::now();
  auto seconds_since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::vector<std::string> options = nvrtc_options(arch, opts);
  const std::string key = cache_key(src, arch, options, opts.emit_ptx);
  BinaryCache* cache = opts.use_cache ? (opts.cache ? opts.cache : &BinaryCache::global()) : nullptr;

  if (cache) {
    if (auto payload = cache->get(key)) {
      auto hit = decode_payload(*payload);
      if (hit) {
        // The entry must export what this source asks for: its recorded
        // names are the source's name expressions, and each lowered name is
        // in the CUBIN (its ELF string table), so another kernel's entry is
        // never launched under this kernel's names.
        std::string wrong;
        if (hit->lowered_names.size() != src.entries.size()) wrong = "a different number of kernels";
        for (const auto& e : src.entries) {
          if (!wrong.empty()) break;
          auto it = hit->lowered_names.find(e.name_expression);
          if (it == hit->lowered_names.end()) wrong = "no kernel " + e.name_expression;
          else if (it->second.empty() || hit->cubin.find(it->second) == std::string::npos)
            wrong = "its CUBIN does not contain " + it->second;
        }
        if (!wrong.empty()) {
          std::fprintf(stderr, "lunajit: warning: cached CUBIN %s of '%s' rejected (%s); recompiling\n",
                       key.c_str(), src.name.c_str(), wrong.c_str());
          hit.reset();
        }
      }
      if (hit) {
        hit->from_cache = true;
        hit->cache_key = key;
        hit->compile_seconds = seconds_since_start();
        return std::move(*hit);
      }
      cache->remove(key);  // well-formed entry, foreign payload: replace it
    }
  }

  const HeaderSet& headers = embedded_headers();
  Program prog;
  if (nvrtcResult r = nvrtcCreateProgram(&prog.handle, src.code.c_str(), (file_name_for(src) + ".cu").c_str(),
                                         static_cast<int>(headers.names.size()), headers.content_ptrs.data(),
                                         headers.name_ptrs.data());
      r != NVRTC_SUCCESS)
    return Error::failure(std::string("nvrtcCreateProgram: ") + nvrtcGetErrorString(r));
  for (const auto& e : src.entries) {
    if (nvrtcResult r = nvrtcAddNameExpression(prog.handle, e.name_expression.c_str()); r != NVRTC_SUCCESS)
      return Error::failure("nvrtcAddNameExpression(" + e.name_expression + "): " + nvrtcGetErrorString(r));
  }
  std::vector<const char*> option_ptrs;
  for (const auto& o : options) option_ptrs.push_back(o.c_str());

  ++g_invocations;
  const nvrtcResult rc =
      nvrtcCompileProgram(prog.handle, static_cast<int>(option_ptrs.size()), option_ptrs.data());
  CompiledKernel out;
  out.options = options;
  out.log = program_log(prog.handle);
  if (rc != NVRTC_SUCCESS) return compile_error(src, arch, options, nvrtcGetErrorString(rc), out.log);

  size_t n = 0;
  if (nvrtcGetCUBINSize(prog.handle, &n) != NVRTC_SUCCESS || n == 0)
    return compile_error(src, arch, options, "no CUBIN produced", out.log);
  out.cubin.resize(n);
  nvrtcGetCUBIN(prog.handle, out.cubin.data());
  if (opts.emit_ptx) {
    if (nvrtcGetPTXSize(prog.handle, &n) != NVRTC_SUCCESS)
      return compile_error(src, arch, options, "no PTX produced", out.log);
    out.ptx.resize(n);
    nvrtcGetPTX(prog.handle, out.ptx.data());
    while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();
  }

  const auto by_lowered = parse_ptxas_resources(out.log);
  for (const auto& e : src.entries) {
    const char* lowered = nullptr;
    if (nvrtcGetLoweredName(prog.handle, e.name_expression.c_str(), &lowered) != NVRTC_SUCCESS || !lowered)
      return compile_error(src, arch, options, "no lowered name for " + e.name_expression, out.log);
    out.lowered_names[e.name_expression] = lowered;
    KernelResources r;
    if (auto it = by_lowered.find(lowered); it != by_lowered.end()) r = it->second;
    r.name_expression = e.name_expression;
    r.lowered_name = lowered;
    out.resources.push_back(std::move(r));
  }
  out.compile_seconds = seconds_since_start();
  out.cache_key = key;
  if (cache) cache->put(key, encode_payload(out));
  return out;
}

}  // namespace lunajit
