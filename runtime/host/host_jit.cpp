// Host JIT (see host_jit.h). The robust path of docs/HOST_JIT_NOTES.md, with
// one change: Clang emits an object file (EmitObjAction into a memory stream)
// instead of an IR module, so that the miss and the hit paths load the same
// bytes the cache stores.
#include "runtime/host/host_jit.h"

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>

#include <clang/Basic/Diagnostic.h>
#include <clang/Basic/DiagnosticOptions.h>
#include <clang/CodeGen/CodeGenAction.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/CompilerInvocation.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <clang/Frontend/Utils.h>
#include <llvm/ADT/SmallString.h>
#include <llvm/ExecutionEngine/Orc/Core.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/VirtualFileSystem.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/TargetParser/Host.h>
#include <fmt/format.h>

#include "common/hash.h"
#include "runtime/host/sanitizer_pass.h"
#include "templates/embedded.h"

namespace lunajit::host {
namespace {

// Where the in-memory file system puts things.
constexpr const char* kTemplateDir = "/lunajit-jit/include";  // lunajit/device.cuh, ...
constexpr const char* kCudaDir = "/lunajit-jit/cuda";         // cuda_fp16.h, ... (-isystem)
constexpr const char* kSourceDir = "/lunajit-jit/src";

std::atomic<std::uint64_t> g_compiles{0};
std::atomic<std::uint64_t> g_cache_hits{0};
std::atomic<std::uint64_t> g_loads{0};

void initialize_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
  });
}

std::string to_string(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return s;
}

std::string file_stem(const KernelSource& source) {
  std::string stem = source.name.empty() ? "kernel" : source.name;
  for (char& c : stem) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') c = '_';
  }
  return stem;
}

// The translation unit on disk, so a failed compile can be reproduced.
std::string dump_source(const KernelSource& source, const std::string& tu, const std::string& key) {
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::temp_directory_path(ec) / "lunajit";
  std::filesystem::create_directories(dir, ec);
  std::filesystem::path path = dir / (file_stem(source) + "-" + key.substr(0, 8) + ".host.cpp");
  std::ofstream out(path, std::ios::binary);
  out << tu;
  return out ? path.string() : std::string("(could not be written)");
}

// Compiles the translation unit to an object file in memory.
Result<std::string> compile_object(const KernelSource& source, const std::string& tu, const std::string& key,
                                   bool instrumented) {
  initialize_llvm();
  auto memory = llvm::makeIntrusiveRefCnt<llvm::vfs::InMemoryFileSystem>();
  for (const EmbeddedFile& f : templates::files()) {
    std::string path = std::string(kTemplateDir) + "/" + std::string(f.path);
    memory->addFile(path, 0, llvm::MemoryBuffer::getMemBuffer(llvm::StringRef(f.contents.data(), f.contents.size()),
                                                              path, /*RequiresNullTerminator=*/false));
  }
  for (const EmbeddedFile& f : cuda_headers::files()) {
    std::string path = std::string(kCudaDir) + "/" + std::string(f.path);
    memory->addFile(path, 0, llvm::MemoryBuffer::getMemBuffer(llvm::StringRef(f.contents.data(), f.contents.size()),
                                                              path, /*RequiresNullTerminator=*/false));
  }
  const std::string source_path = std::string(kSourceDir) + "/" + file_stem(source) + ".cpp";
  memory->addFile(source_path, 0, llvm::MemoryBuffer::getMemBufferCopy(tu, source_path));
  auto overlay = llvm::makeIntrusiveRefCnt<llvm::vfs::OverlayFileSystem>(llvm::vfs::getRealFileSystem());
  overlay->pushOverlay(memory);

  std::string log;
  llvm::raw_string_ostream log_stream(log);
  auto diag_options = llvm::makeIntrusiveRefCnt<clang::DiagnosticOptions>();
  clang::TextDiagnosticPrinter printer(log_stream, diag_options.get());
  llvm::IntrusiveRefCntPtr<clang::DiagnosticsEngine> diags =
      clang::CompilerInstance::createDiagnostics(diag_options.get(), &printer, /*ShouldOwnClient=*/false);

  std::vector<const char*> argv{LUNAJIT_CLANG_BINARY};
  for (const std::string& flag : host_compile_flags(instrumented)) argv.push_back(flag.c_str());
  argv.push_back("-c");
  argv.push_back(source_path.c_str());

  auto fail = [&](std::string_view what) -> Error {
    log_stream.flush();
    return Error{ErrorKind::compile_failed,
                 fmt::format("host compile of '{}' failed ({}):\n{}\nsource: {}", file_stem(source), what, log,
                             dump_source(source, tu, key))};
  };

  clang::CreateInvocationOptions options;
  options.Diags = diags;
  options.VFS = overlay;
  std::unique_ptr<clang::CompilerInvocation> invocation = clang::createInvocation(argv, options);
  if (!invocation) return fail("invalid compiler invocation");
  // The driver asks cc1 for -disable-free: a compiler process exits after one
  // file, so it skips freeing the AST, the module and the TargetMachine. Here
  // the process goes on compiling, so free them (as LibTooling and clang-repl
  // do); otherwise every compile kept ~3 MB (HostJit.ColdCompilesReleaseTheirMemory).
  invocation->getFrontendOpts().DisableFree = false;
  invocation->getCodeGenOpts().DisableFree = false;

  clang::CompilerInstance compiler;
  compiler.setInvocation(std::shared_ptr<clang::CompilerInvocation>(std::move(invocation)));
  if (instrumented) compiler.getCodeGenOpts().PassBuilderCallbacks.push_back(&register_access_instrumentation);
  compiler.createDiagnostics(&printer, /*ShouldOwnClient=*/false);
  compiler.createFileManager(overlay);
  compiler.setVerboseOutputStream(llvm::nulls());  // "1 error generated." goes nowhere; the log has the errors

  llvm::SmallString<0> object;
  compiler.setOutputStream(std::make_unique<llvm::raw_svector_ostream>(object));
  llvm::LLVMContext context;
  clang::EmitObjAction action(&context);
  const bool ok = compiler.ExecuteAction(action);
  if (!ok || compiler.getDiagnostics().hasErrorOccurred()) return fail("Clang " LUNAJIT_CLANG_VERSION);
  if (object.empty()) return fail("no object code was produced");
  g_compiles.fetch_add(1, std::memory_order_relaxed);
  return std::string(object.data(), object.size());
}

}  // namespace

HostJitCounters host_jit_counters() {
  return {g_compiles.load(), g_cache_hits.load(), g_loads.load()};
}

const std::vector<std::string>& host_compile_flags(bool instrumented) {
  // -femulated-tls: `__shared__` is thread_local, and ORC without its runtime
  //   supports emulated TLS only.
  // -fno-exceptions: kernels throw nothing, and an abandoned fiber is never unwound.
  // -fno-math-errno: CUDA math sets no errno; lets sqrtf & co. vectorize.
  // -O0 for the plain variant: an emulated launch spends its time switching
  //   fibers at barriers and shuffles, not in the kernel's arithmetic, so -O2
  //   bought ~10% of run time (default LUNA backward, B2 H4 N2048: 0.86 s at
  //   -O2, 1.06 s at -O0) for 4x the compile time (slay backward: 18 s of
  //   CPU at -O2, 8.5 s at -O1, 4.6 s at -O0), and compiles are nearly all of
  //   what the test suite spends on the host backend.
  // -O2 for the instrumented variant: its access pass runs after the optimizer
  //   so that only accesses surviving register promotion are instrumented
  //   (sanitizer_pass.h); at -O0 every local would be a memory access.
  static const std::vector<std::string> common{
      "-std=c++20", "-march=native", "-femulated-tls", "-fno-exceptions", "-fno-math-errno",
      "-DLUNAJIT_HOST_EMULATION", "-resource-dir", CLANG_RESOURCE_DIR, "-I", kTemplateDir, "-isystem", kCudaDir,
      "-Wno-unused-function"};
  static const std::vector<std::string> plain_flags = [] {
    std::vector<std::string> f = common;
    f.push_back("-O0");
    return f;
  }();
  static const std::vector<std::string> instrumented_flags = [] {
    std::vector<std::string> f = common;
    for (const char* extra : {"-O2", "-gline-tables-only", "-fno-vectorize", "-fno-slp-vectorize",
                              "-ftrivial-auto-var-init=pattern",
                              "-DLUNAJIT_HOST_INSTRUMENTED=2" /* access pass version */}) {
      f.push_back(extra);
    }
    return f;
  }();
  return instrumented ? instrumented_flags : plain_flags;
}

std::string host_translation_unit(const KernelSource& source) {
  std::string tu = source.code;
  if (!tu.empty() && tu.back() != '\n') tu += '\n';
  tu +=
      "\n// ---- host emulation entry points (appended by runtime/host/host_jit.cpp) ----\n"
      "#include <cstddef>\n"
      "#include <type_traits>\n"
      "#include <utility>\n"
      "namespace lunajit_host_entry {\n"
      "template <class... A, std::size_t... I>\n"
      "inline void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {\n"
      "  kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);\n"
      "}\n"
      "template <class... A>\n"
      "inline void call(void (*kernel)(A...), void** args) {\n"
      "  call(kernel, args, std::index_sequence_for<A...>{});\n"
      "}\n"
      "}  // namespace lunajit_host_entry\n";
  for (std::size_t i = 0; i < source.entries.size(); ++i) {
    std::string_view expr = source.entries[i].name_expression;
    if (!expr.empty() && expr.front() == '&') expr.remove_prefix(1);
    tu += fmt::format("extern \"C\" void lunajit_entry_{}(void** args) {{ ::lunajit_host_entry::call(&{}, args); }}\n",
                      i, expr);
  }
  return tu;
}

std::string host_cache_key(const KernelSource& source, bool instrumented) {
  Hasher h;
  h.add("lunajit host object").add(LUNAJIT_VERSION).add(LUNAJIT_CLANG_VERSION);
  h.add(host_translation_unit(source));
  for (const EmbeddedFile& f : templates::files()) h.add(f.path).add(f.contents);
  for (const EmbeddedFile& f : cuda_headers::files()) h.add(f.path).add(f.contents);
  for (const std::string& flag : host_compile_flags(instrumented)) h.add(flag);
  // -march=native: the object is only valid for this CPU.
  static const std::string cpu = [] {
    std::vector<std::string> features;
    for (const auto& f : llvm::sys::getHostCPUFeatures()) {
      if (f.getValue()) features.push_back(f.getKey().str());
    }
    std::sort(features.begin(), features.end());
    std::string s = llvm::sys::getHostCPUName().str();
    for (const std::string& f : features) s += "," + f;
    return s;
  }();
  h.add(cpu);
  h.add("host");
  return h.hex();
}

// The entry points an object defines must be exactly lunajit_entry_0 ..
// lunajit_entry_{n-1}, checked before the object is linked: an object that is
// not what the source asks for (a cache entry of another kernel, however it got
// there) is never run. "" when it matches, else what is wrong.
std::string check_exports(std::string_view object, std::size_t n) {
  auto obj = llvm::object::ObjectFile::createObjectFile(
      llvm::MemoryBufferRef(llvm::StringRef(object.data(), object.size()), "cached.o"));
  if (!obj) return "not an object file: " + to_string(obj.takeError());
  std::vector<bool> seen(n, false);
  std::string extra;
  for (const llvm::object::SymbolRef& sym : (*obj)->symbols()) {
    llvm::Expected<llvm::StringRef> name = sym.getName();
    if (!name) {
      llvm::consumeError(name.takeError());
      continue;
    }
    llvm::Expected<std::uint32_t> flags = sym.getFlags();
    if (!flags) {
      llvm::consumeError(flags.takeError());
      continue;
    }
    if ((*flags & llvm::object::SymbolRef::SF_Undefined) != 0) continue;
    llvm::StringRef rest = *name;
    if (!rest.consume_front("lunajit_entry_")) continue;
    std::size_t i = 0;
    if (rest.getAsInteger(10, i) || i >= n) {
      extra = name->str();
      continue;
    }
    seen[i] = true;
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!seen[i]) return fmt::format("it does not define lunajit_entry_{}", i);
  if (!extra.empty()) return fmt::format("it defines {}, which this kernel source does not have", extra);
  return "";
}

struct HostProgram::Jit {
  std::unique_ptr<llvm::orc::LLJIT> jit;
};

HostProgram::HostProgram() = default;
HostProgram::~HostProgram() = default;

Result<std::unique_ptr<HostProgram>> load_host_program(const KernelSource& source, BinaryCache& cache,
                                                      bool instrumented) {
  if (source.entries.empty()) {
    return Error::invalid(fmt::format("kernel source '{}' has no entries to load", file_stem(source)));
  }
  const std::string key = host_cache_key(source, instrumented);
  std::string object;
  std::optional<std::string> cached = cache.get(key);
  if (cached) {
    if (std::string wrong = check_exports(*cached, source.entries.size()); !wrong.empty()) {
      std::fprintf(stderr, "lunajit: warning: cached host object %s of '%s' rejected (%s); recompiling\n",
                   key.c_str(), file_stem(source).c_str(), wrong.c_str());
      cache.remove(key);
      cached.reset();
    }
  }
  if (cached) {
    object = std::move(*cached);
    g_cache_hits.fetch_add(1, std::memory_order_relaxed);
  } else {
    Result<std::string> compiled = compile_object(source, host_translation_unit(source), key, instrumented);
    if (!compiled) return compiled.error();
    object = std::move(compiled.value());
    if (std::string wrong = check_exports(object, source.entries.size()); !wrong.empty())
      return Error{ErrorKind::compile_failed,
                   fmt::format("host object of '{}' is malformed: {}", file_stem(source), wrong)};
    cache.put(key, object);
  }

  initialize_llvm();
  auto link_error = [&](std::string what) -> Error {
    return Error{ErrorKind::compile_failed,
                 fmt::format("host link of '{}' failed: {} (object key {})", file_stem(source), what, key)};
  };
  llvm::Expected<std::unique_ptr<llvm::orc::LLJIT>> jit = llvm::orc::LLJITBuilder().create();
  if (!jit) return link_error(to_string(jit.takeError()));
  llvm::orc::LLJIT& j = **jit;

  llvm::orc::SymbolMap host_symbols;
  for (const HostSymbol& s : emulation_symbols()) {
    host_symbols[j.mangleAndIntern(s.name)] = {llvm::orc::ExecutorAddr::fromPtr(s.address),
                                               llvm::JITSymbolFlags::Exported};
  }
  if (llvm::Error e = j.getMainJITDylib().define(llvm::orc::absoluteSymbols(std::move(host_symbols)))) {
    return link_error(to_string(std::move(e)));
  }
  if (llvm::Error e = j.addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(object, file_stem(source) + ".o"))) {
    return link_error(to_string(std::move(e)));
  }

  std::unique_ptr<HostProgram> program(new HostProgram());
  for (std::size_t i = 0; i < source.entries.size(); ++i) {
    llvm::Expected<llvm::orc::ExecutorAddr> addr = j.lookup(fmt::format("lunajit_entry_{}", i));
    if (!addr) return link_error(to_string(addr.takeError()));
    program->entries_.push_back(addr->toPtr<KernelEntryFn>());
  }
  program->jit_ = std::make_unique<HostProgram::Jit>();
  program->jit_->jit = std::move(*jit);
  g_loads.fetch_add(1, std::memory_order_relaxed);
  return program;
}

}  // namespace lunajit::host
