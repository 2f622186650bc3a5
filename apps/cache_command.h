// `lunajit cache stats|ls|clear|export FILE|import FILE`: the binary cache
// (cache/binary_cache.h) and the tuning databases (cache/tuning_db.h) under
// LUNAJIT_CACHE_DIR (else $XDG_CACHE_HOME/lunajit, else ~/.cache/lunajit).
//   stats         entries and bytes of both, the size bound, damaged or foreign files
//   ls            every tuning entry: device, spec, pass, bucket, config, method, origin
//   clear         removes compiled kernels and tuning databases (exit 1 when some
//                 could not be removed, with the reason)
//   export FILE   every tuning database as one JSON file (a fleet tunes once per GPU
//                 model), written to a temp file and renamed: a failed export
//                 leaves the previous FILE as it was
//   import FILE   merges such a file, all or nothing (a local measurement beats
//                 anything imported; then measured beats model-ranked, then newer)
// Damaged tuning databases are reported and set aside, never fatal. Exit 2 for
// bad input (an invalid import file, LUNAJIT_CACHE_MAX_MB), 1 for failures (an
// insecure cache directory, I/O errors).
#pragma once

#include "apps/subcommand.h"
#include "common/result.h"

namespace lunajit {

Subcommand add_cache_command(CLI::App& app);

// BinaryCache::check_environment() for the commands that use the cache
// (compile, run, demo, report; tune and cache check it themselves): an invalid
// LUNAJIT_CACHE_MAX_MB (invalid_argument: exit 2) or an insecure cache
// directory (runtime_failure: exit 1).
Status check_cache_environment();

}  // namespace lunajit
