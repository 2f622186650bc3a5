// `lunajit cache stats|ls|clear|export FILE|import FILE`: the binary cache
// (cache/binary_cache.h) and the tuning databases (cache/tuning_db.h) under
// LUNAJIT_CACHE_DIR (else $XDG_CACHE_HOME/lunajit, else ~/.cache/lunajit).
//   stats         entries and bytes of both, the size bound
//   ls            every tuning entry: device, spec, pass, bucket, config, method
//   clear         removes compiled kernels and tuning databases
//   export FILE   every tuning database as one JSON file (a fleet tunes once per GPU model)
//   import FILE   merges such a file (measured beats model-ranked, then newer)
#pragma once

#include "apps/subcommand.h"

namespace lunajit {

Subcommand add_cache_command(CLI::App& app);

}  // namespace lunajit
