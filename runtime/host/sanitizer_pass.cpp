// The host sanitizers' instrumentation (see sanitizer_pass.h).
#include "runtime/host/sanitizer_pass.h"

#include <llvm/Analysis/ValueTracking.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/DebugInfoMetadata.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InstIterator.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/IntrinsicInst.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/PassManager.h>
#include <llvm/Passes/PassBuilder.h>

#include <map>
#include <utility>
#include <vector>

#include "templates/lunajit/emulation/host_abi.h"

namespace lunajit::host {
namespace {

// Memory the kernel can only reach through its own frame or the module's
// constants: a stack slot, a constant (non-thread-local) global, or the
// CUDA-style argument array of an entry wrapper and what it points to.
bool uninteresting(const llvm::Value* ptr, const llvm::Function& f) {
  const llvm::Value* base = llvm::getUnderlyingObject(ptr, 12);
  if (llvm::isa<llvm::AllocaInst>(base)) return true;
  if (const auto* g = llvm::dyn_cast<llvm::GlobalVariable>(base)) return !g->isThreadLocal();
  const bool entry = f.getName().starts_with("lunajit_entry_");
  if (entry && llvm::isa<llvm::Argument>(base)) return true;  // void** args
  if (const auto* load = llvm::dyn_cast<llvm::LoadInst>(base); load != nullptr && entry) {
    // args[i]: the i-th kernel parameter, owned by the launching thread.
    return llvm::isa<llvm::Argument>(llvm::getUnderlyingObject(load->getPointerOperand(), 12));
  }
  return false;
}

class Instrumenter {
 public:
  explicit Instrumenter(llvm::Module& m) : m_(m), ctx_(m.getContext()) {
    llvm::Type* ptr = llvm::PointerType::getUnqual(ctx_);
    site_type_ = llvm::StructType::get(ctx_, {ptr, llvm::Type::getInt32Ty(ctx_), llvm::Type::getInt32Ty(ctx_)});
    access_ = m.getOrInsertFunction(
        "lunajit_emu_access", llvm::FunctionType::get(llvm::Type::getVoidTy(ctx_),
                                                      {ptr, llvm::Type::getInt64Ty(ctx_),
                                                       llvm::Type::getInt32Ty(ctx_), ptr},
                                                      false));
  }

  bool run() {
    bool changed = false;
    for (llvm::Function& f : m_) {
      if (f.isDeclaration()) continue;
      std::vector<llvm::Instruction*> work;
      for (llvm::Instruction& i : llvm::instructions(f)) {
        if (llvm::isa<llvm::LoadInst>(i) || llvm::isa<llvm::StoreInst>(i) || llvm::isa<llvm::MemIntrinsic>(i)) {
          work.push_back(&i);
        }
      }
      for (llvm::Instruction* i : work) changed |= instrument(*i, f);
    }
    return changed;
  }

 private:
  bool instrument(llvm::Instruction& i, const llvm::Function& f) {
    const llvm::DataLayout& dl = m_.getDataLayout();
    llvm::IRBuilder<> b(&i);
    auto call = [&](llvm::Value* ptr, llvm::Value* size, unsigned flags) {
      b.CreateCall(access_, {ptr, size, b.getInt32(flags), site(i)});
    };
    auto align_flags = [](llvm::Align a) { return static_cast<unsigned>(llvm::Log2(a)) << LUNAJIT_EMU_ACCESS_ALIGN_SHIFT; };
    if (auto* load = llvm::dyn_cast<llvm::LoadInst>(&i)) {
      if (load->isAtomic() || uninteresting(load->getPointerOperand(), f)) return false;
      const auto bytes = dl.getTypeStoreSize(load->getType()).getFixedValue();
      call(load->getPointerOperand(), b.getInt64(bytes), align_flags(load->getAlign()));
      load->setAlignment(llvm::Align(1));  // checked: codegen must not fault on it (movups, not movaps)
      return true;
    }
    if (auto* store = llvm::dyn_cast<llvm::StoreInst>(&i)) {
      if (store->isAtomic() || uninteresting(store->getPointerOperand(), f)) return false;
      const auto bytes = dl.getTypeStoreSize(store->getValueOperand()->getType()).getFixedValue();
      call(store->getPointerOperand(), b.getInt64(bytes), LUNAJIT_EMU_ACCESS_WRITE | align_flags(store->getAlign()));
      store->setAlignment(llvm::Align(1));
      return true;
    }
    auto* mem = llvm::cast<llvm::MemIntrinsic>(&i);
    bool changed = false;
    llvm::Value* len = b.CreateZExtOrTrunc(mem->getLength(), b.getInt64Ty());
    if (!uninteresting(mem->getDest(), f)) {
      call(mem->getDest(), len, LUNAJIT_EMU_ACCESS_WRITE);
      changed = true;
    }
    if (auto* transfer = llvm::dyn_cast<llvm::MemTransferInst>(mem); transfer && !uninteresting(transfer->getSource(), f)) {
      call(transfer->getSource(), len, 0);
      changed = true;
    }
    return changed;
  }

  // A constant {file, line, column} for the instruction's source location (the
  // innermost inlined frame, i.e. the line that does the access).
  llvm::Constant* site(const llvm::Instruction& i) {
    std::string file = "?";
    unsigned line = 0, col = 0;
    if (const llvm::DebugLoc& loc = i.getDebugLoc()) {
      line = loc.getLine();
      col = loc.getCol();
      if (auto* scope = llvm::dyn_cast<llvm::DIScope>(loc.getScope())) file = scope->getFilename().str();
    }
    auto key = std::make_pair(file, std::make_pair(line, col));
    if (auto it = sites_.find(key); it != sites_.end()) return it->second;
    llvm::Constant* name = files_.count(file) ? files_[file] : (files_[file] = make_string(file));
    auto* init = llvm::ConstantStruct::get(site_type_, {name, llvm::ConstantInt::get(llvm::Type::getInt32Ty(ctx_), line),
                                                        llvm::ConstantInt::get(llvm::Type::getInt32Ty(ctx_), col)});
    auto* g = new llvm::GlobalVariable(m_, site_type_, /*isConstant=*/true, llvm::GlobalValue::PrivateLinkage, init,
                                       "lunajit.site");
    return sites_[key] = g;
  }
  llvm::Constant* make_string(const std::string& s) {
    llvm::Constant* data = llvm::ConstantDataArray::getString(ctx_, s);
    return new llvm::GlobalVariable(m_, data->getType(), true, llvm::GlobalValue::PrivateLinkage, data,
                                    "lunajit.site.file");
  }

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::StructType* site_type_;
  llvm::FunctionCallee access_;
  std::map<std::pair<std::string, std::pair<unsigned, unsigned>>, llvm::Constant*> sites_;
  std::map<std::string, llvm::Constant*> files_;
};

struct AccessInstrumentationPass : llvm::PassInfoMixin<AccessInstrumentationPass> {
  llvm::PreservedAnalyses run(llvm::Module& m, llvm::ModuleAnalysisManager&) {
    return Instrumenter(m).run() ? llvm::PreservedAnalyses::none() : llvm::PreservedAnalyses::all();
  }
  static bool isRequired() { return true; }
};

}  // namespace

void register_access_instrumentation(llvm::PassBuilder& pb) {
  pb.registerOptimizerLastEPCallback([](llvm::ModulePassManager& mpm, llvm::OptimizationLevel) {
    mpm.addPass(AccessInstrumentationPass());
  });
}

}  // namespace lunajit::host
