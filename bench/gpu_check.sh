#!/usr/bin/env bash
# The prepared GPU check (issue 11 item 4). UNRUN on a GPU so far: written and
# dry-run on the CPU-only development machine only.
#
#   bench/gpu_check.sh prepare   (here, with the Debian packages installed) copies
#       the build dependencies the GPU image lacks (nlohmann-json, CLI11, fmt,
#       xxhash, libpng, Google Test/Benchmark, Boost.Context) into .gpu-deps/
#       (git-ignored; carry it to the GPU machine with the working tree)
#   bench/gpu_check.sh run       (on the GPU machine: CUDA 13, PyTorch with CUDA,
#       CMake, ninja; no LLVM 19, no network): configures with
#       -DLUNAJIT_HOST_JIT=OFF and the PyTorch's LibTorch
#       (torch.utils.cmake_prefix_path), builds, runs the GPU tests, tunes the
#       default spec on the GPU, benchmarks forward and forward+backward against
#       the eager ATen composition and torch SDPA (bench/gpu_bench.py: B=8, H=12,
#       d=64, N in {1K,4K,16K,64K}, bf16, causal and not) and writes a measured
#       kernel report; everything lands in $OUT (default gpu-check-out/): JSON,
#       Markdown and the logs; also the per-token decode latency (decode_bench,
#       batch 1 and 64). Stage time limits: configure 90 s + build 240 s, then the
#       GPU stages 8 min 40 s (tests 2 min, tune 1, decode 0.5, bench 2.5, the
#       Google Benchmark suite bench/attention_bench 2, report 0.7): up to 14 min
#       10 s in all, more than the 8-minute target when the build is cold
#       (unmeasured: no GPU has run this script yet).
#   bench/gpu_check.sh --dry-run checks what can be checked without a GPU: the
#       script's syntax, the tools, the no-JIT configure step, the benchmark's
#       table writer (and its CPU dry run when python3 has torch).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/gpu-check-out}
deps=$root/.gpu-deps
build=${GPU_CHECK_BUILD:-$root/build-gpu-check}

log() { echo "gpu_check: $*" >&2; }
stage() {  # stage NAME SECONDS CMD...: runs CMD under a time limit, logs to $out/NAME.log
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  log "$name (limit ${limit}s)"
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then
    log "$name: ok in $((SECONDS - t0)) s"
    echo "{\"stage\": \"$name\", \"ok\": true, \"seconds\": $((SECONDS - t0))}" >>"$out/stages.jsonl"
  else
    local rc=$?
    log "$name: FAILED (exit $rc) after $((SECONDS - t0)) s; tail of $out/$name.log:"
    tail -n 20 "$out/$name.log" >&2 || true
    echo "{\"stage\": \"$name\", \"ok\": false, \"exit\": $rc, \"seconds\": $((SECONDS - t0))}" >>"$out/stages.jsonl"
    failed=1
  fi
}

prepare() {
  local pkgs="nlohmann-json3-dev libcli11-dev libfmt-dev libxxhash-dev libpng-dev libbenchmark-dev libgtest-dev"
  pkgs+=" libboost-context1.74-dev libboost1.74-dev"
  rm -rf "$deps"
  mkdir -p "$deps"
  for p in $pkgs; do
    dpkg -s "$p" >/dev/null 2>&1 || { log "prepare: package $p is not installed here"; exit 1; }
    # The package's files and, for -dev packages, the shared libraries they link to.
    dpkg -L "$p" | while read -r f; do
      [[ -f $f && $f == /usr/* ]] || continue
      case $f in /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*) continue ;; esac
      mkdir -p "$deps$(dirname "$f")"
      cp -a "$f" "$deps$f"
    done
  done
  # Runtime libraries behind the .so links (libfmt.so.9, libboost_context.so.1.74.0, ...).
  for l in "$deps"/usr/lib/*/*.so; do
    local real
    real=$(readlink -f "/usr/lib/$(basename "$(dirname "$l")")/$(basename "$l")") || continue
    [[ -f $real ]] && cp -a "$real" "$deps${real}"
  done
  # pkg-config files name /usr as their prefix.
  find "$deps" -name '*.pc' -exec sed -i "s|^prefix=/usr|prefix=\${pcfiledir}/../../..|" {} +
  log "prepare: $(du -sh "$deps" | cut -f1) in $deps (carry it with the working tree)"
}

configure() {
  local torch_prefix
  torch_prefix=${TORCH_PREFIX:-$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')}
  export PKG_CONFIG_PATH=$(find "$deps" -type d -name pkgconfig | tr '\n' ':')${PKG_CONFIG_PATH:-}
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLUNAJIT_HOST_JIT=OFF \
    -DLUNAJIT_WITH_TORCH=ON -DCMAKE_PREFIX_PATH="$deps/usr;$torch_prefix" "$@"
}

run_gpu() {
  command -v nvidia-smi >/dev/null && nvidia-smi -L >"$out/device.txt" 2>&1 || true
  [[ -d $deps ]] || { log "no $deps: run 'bench/gpu_check.sh prepare' on the development machine and carry it"; exit 1; }
  export LD_LIBRARY_PATH=$(find "$deps" -name '*.so*' -printf '%h\n' | sort -u | tr '\n' ':')${LD_LIBRARY_PATH:-}
  export LUNAJIT_CACHE_DIR=$out/kernel-cache
  failed=0
  stage configure 90 configure
  stage build 240 cmake --build "$build" --target lunajit nvrtc_tests torch_binding_tests lunajit_torch_shared decode_bench attention_bench -j "$(nproc)"
  stage gpu_tests 60 "$build/tests/runtime_nvrtc/nvrtc_tests" --gtest_filter='*Cuda*:*Gpu*' --gtest_brief=1
  stage torch_gpu_tests 60 "$build/tests/torch_binding/torch_binding_tests" --gtest_filter='*Gpu*' --gtest_brief=1
  stage tune 60 "$build/apps/lunajit" tune --backend cuda --shapes 8,12,16384 --json
  # Per-token decode latency (issue 14) at batch 1 and 64, and the full causal
  # forward over the same prefixes at batch 1 for comparison.
  stage decode 30 env LUNAJIT_BACKEND=cuda "$build/bench/decode_bench" \
    --benchmark_filter='BM_DecodeStep/[0-9]+/(1|64)$|BM_FullCausalForwardOverPrefix/[0-9]+/1$' \
    --benchmark_out="$out/decode_bench.json" --benchmark_out_format=json
  stage bench 150 env PYTHONPATH="$build/python" python3 "$root/bench/gpu_bench.py" --out "$out"
  # The same comparison from C++ (Google Benchmark, no Python in the timed loop).
  stage cpp_bench 120 "$build/bench/attention_bench" --benchmark_out="$out/attention_bench.json" \
    --benchmark_out_format=json
  stage report 40 "$build/apps/lunajit" report --arch "$(python3 -c 'import torch; c=torch.cuda.get_device_capability(); print(f"sm_{c[0]}{c[1]}")')" \
    --shapes "8,12,16384" --causal both --out "$out/report"
  [[ -f $out/tune.log ]] && cp "$out/tune.log" "$out/tune.json"
  log "results in $out (gpu_bench.md, gpu_bench.json, report/, stages.jsonl)"
  return $failed
}

dry_run() {
  failed=0
  bash -n "$0"
  for t in cmake ninja python3 timeout; do command -v "$t" >/dev/null || { log "dry run: $t missing"; failed=1; }; done
  python3 "$root/bench/gpu_bench.py" --self-test
  # The no-JIT configure (no build): the option is honoured and LLVM is not looked for.
  local b
  b=$(mktemp -d)
  cmake -S "$root" -B "$b" -G Ninja -DLUNAJIT_HOST_JIT=OFF -DLUNAJIT_BUILD_TESTS=OFF -DLUNAJIT_BUILD_BENCH=OFF \
    -DLUNAJIT_WITH_TORCH=OFF >"$b/configure.log" 2>&1 || { log "dry run: no-JIT configure failed:"; tail "$b/configure.log" >&2; failed=1; }
  if grep -q '^LLVM_DIR:PATH=' "$b/CMakeCache.txt" 2>/dev/null; then log "dry run: LLVM looked for with LUNAJIT_HOST_JIT=OFF"; failed=1; fi
  rm -rf "$b"
  if python3 -c 'import torch, lunajit' 2>/dev/null; then
    python3 "$root/bench/gpu_bench.py" --dry-run --out "$(mktemp -d)"
  else
    log "dry run: python3 has no torch/lunajit here; gpu_bench.py --dry-run not run"
  fi
  [[ $failed == 0 ]] && log "dry run: ok (the GPU stages are unrun)"
  return $failed
}

case ${1:-} in
  prepare) prepare ;;
  run) mkdir -p "$out"; : >"$out/stages.jsonl"; run_gpu ;;
  --dry-run) dry_run ;;
  *) echo "usage: bench/gpu_check.sh prepare | run | --dry-run" >&2; exit 2 ;;
esac
