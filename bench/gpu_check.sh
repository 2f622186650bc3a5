#!/usr/bin/env bash
# The prepared GPU check (issue 11 item 4).
#
#   bench/gpu_check.sh prepare   (here, with the Debian packages installed) copies
#       the build dependencies the GPU image lacks (nlohmann-json, CLI11, fmt,
#       xxhash, libpng + zlib, Google Test/Benchmark, Boost.Context's library and
#       the 16 Boost headers it includes, pkgconf) into .gpu-deps/ (git-ignored,
#       5.4 MB; carry it to the GPU machine with the working tree)
#   bench/gpu_check.sh run       (on the GPU machine: CUDA 13, PyTorch with CUDA,
#       CMake, ninja; no LLVM 19, no network): configures with
#       -DLUNAJIT_HOST_JIT=OFF and the PyTorch's LibTorch
#       (torch.utils.cmake_prefix_path; without LibTorch if that configure
#       fails), builds, then in order of worth: every kernel of 14 specs against
#       the double reference on the GPU (lunajit run --check, forward and
#       backward), the benchmark against the eager ATen composition and torch
#       SDPA (bench/gpu_bench.py: B=8, H=12, d=64, N in {1K,4K,16K}, bf16, causal
#       and not; lunajit vs eager outputs and gradients up to 4K), the measured
#       kernel report (predicted beside measured per kernel), an Nsight Compute
#       profile of the default spec's kernels (stall reasons, shared-memory
#       wavefronts and bank conflicts, occupancy: profile/), the CUDA runtime
#       tests, compute-sanitizer (memcheck, racecheck) on the default spec, a
#       tune of the default spec, the LibTorch GPU tests, N = 64K, the Google
#       Benchmark suite and the decode latency. The whole run has a budget
#       (GPU_CHECK_BUDGET, default 540 s) and each stage a limit; stages the
#       budget does not reach are recorded as skipped. Results: $OUT (default
#       gpu-check-out/) gets summary.md, stages.jsonl and results.tar.gz (all
#       logs, gpu_bench.md/json, checks.txt, report/), refreshed after each stage.
#   bench/gpu_check.sh --dry-run checks what can be checked without a GPU: the
#       script's syntax, the tools, the no-JIT configure step, the benchmark's
#       table writer (and its CPU dry run when python3 has torch).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/gpu-check-out}
deps=$root/.gpu-deps
build=${GPU_CHECK_BUILD:-$root/build-gpu-check}

log() { echo "gpu_check: $(date +%T) $*" >&2; }

# Every stage runs under its own limit and under the whole run's deadline
# ($GPU_CHECK_BUDGET seconds from the start, default 540): a device lease is
# short, so the stages go in order of what they are worth, and what is left when
# the deadline comes is skipped and recorded as such, never silently dropped.
# After each stage the results so far are packed into $out (results.tar.gz,
# summary.md), so a run killed from outside still returns what it measured.
budget=${GPU_CHECK_BUDGET:-540}
deadline=$((SECONDS + budget))
stage() {  # stage NAME SECONDS CMD...: runs CMD under min(limit, time left), logs to $work/NAME.log
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS - 5))
  if ((left < 10)); then
    log "$name: skipped (the run's ${budget}-s budget is spent)"
    echo "{\"stage\": \"$name\", \"ok\": false, \"skipped\": \"budget spent\"}" >>"$work/stages.jsonl"
    failed=1
    return 0
  fi
  ((limit > left)) && limit=$left
  local t0=$SECONDS
  log "$name (limit ${limit}s)"
  # timeout runs programs only: this script's own functions run in a child bash (exported below).
  local cmd=("$@")
  declare -F "$1" >/dev/null && cmd=(bash -c '"$@"' _ "$@")
  if timeout -k 5 "$limit" "${cmd[@]}" >"$work/$name.log" 2>&1; then
    log "$name: ok in $((SECONDS - t0)) s"
    echo "{\"stage\": \"$name\", \"ok\": true, \"seconds\": $((SECONDS - t0))}" >>"$work/stages.jsonl"
  else
    local rc=$?
    log "$name: FAILED (exit $rc) after $((SECONDS - t0)) s; tail of $name.log:"
    tail -n 25 "$work/$name.log" >&2 || true
    echo "{\"stage\": \"$name\", \"ok\": false, \"exit\": $rc, \"seconds\": $((SECONDS - t0))}" >>"$work/stages.jsonl"
    failed=1
  fi
  pack
}
pack() {  # the results so far into $out: one tarball (the device tool returns few files) and a summary
  {
    echo "# gpu_check summary"
    echo
    cat "$work/device.txt" 2>/dev/null || true
    echo
    echo '```'
    cat "$work/stages.jsonl"
    echo '```'
    [[ -f $work/gpu_bench.md ]] && cat "$work/gpu_bench.md"
    [[ -f $work/checks.txt ]] && { echo; echo '## Kernels vs the double reference on the GPU'; echo '```'; cat "$work/checks.txt"; echo '```'; }
  } >"$out/summary.md"
  cp "$work/stages.jsonl" "$out/" 2>/dev/null || true
  tar -C "$work" --exclude=kernel-cache -czf "$out/results.tar.gz.tmp" . 2>/dev/null && mv "$out/results.tar.gz.tmp" "$out/results.tar.gz"
}

prepare() {
  local pkgs="nlohmann-json3-dev libcli11-dev libfmt-dev libxxhash-dev libpng-dev libbenchmark-dev libgtest-dev"
  pkgs+=" libboost-context1.74-dev libboost1.74-dev zlib1g-dev"  # zlib: FindPNG requires it
  rm -rf "$deps"
  mkdir -p "$deps"
  # Boost's headers are 150 MB and the working tree that travels is limited to
  # 64 MiB: only the ones the Boost.Context user includes (the compiler's -M list).
  local boost_headers
  boost_headers=$(c++ -std=c++20 -DBOOST_ALL_NO_LIB -DBOOST_CONTEXT_DYN_LINK -I"$root" -I"$root/templates" \
    -isystem /usr/local/cuda/include -M "$root/runtime/host/fiber_scheduler.cpp" | tr ' \\' '\n\n' |
    grep '^/usr/include/boost/' | sort -u)
  for p in $pkgs; do
    dpkg -s "$p" >/dev/null 2>&1 || { log "prepare: package $p is not installed here"; exit 1; }
    # The package's files and, for -dev packages, the shared libraries they link to.
    dpkg -L "$p" | while read -r f; do
      [[ -f $f && $f == /usr/* ]] || continue
      case $f in /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*) continue ;; esac
      if [[ $f == /usr/include/boost/* ]] && ! grep -qxF "$f" <<<"$boost_headers"; then continue; fi
      mkdir -p "$deps$(dirname "$f")"
      cp -a "$f" "$deps$f"
    done
  done
  # Runtime libraries behind the .so links (libfmt.so.9, libboost_context.so.1.74.0, ...).
  # Every libX.so.* beside a carried libX.so: the real file and the soname link
  # (libbenchmark.so.1debian, libfmt.so.9, ...), which the loader looks for.
  for l in "$deps"/usr/lib/*/*.so; do
    local dir=/usr/lib/$(basename "$(dirname "$l")") f
    for f in "$dir/$(basename "$l")".*; do
      [[ -e $f ]] && cp -a "$f" "$deps$dir/"
    done
  done
  # zlib is there for linking only: at run time the image's own libz.so.1 (which
  # the Python interpreter also loads) must win over the carried one.
  rm -f "$deps"/usr/lib/*/libz.so.1
  # pkg-config itself (CMake's FindPkgConfig finds xxhash with it; the GPU image may have none).
  mkdir -p "$deps/usr/bin" "$deps/usr/lib/x86_64-linux-gnu"
  cp "$(readlink -f /usr/bin/pkgconf)" "$deps/usr/bin/pkgconf"
  cp "$(readlink -f /usr/lib/x86_64-linux-gnu/libpkgconf.so.3)" "$deps/usr/lib/x86_64-linux-gnu/libpkgconf.so.3"
  # pkg-config files name /usr as their prefix.
  find "$deps" -name '*.pc' -exec sed -i "s|^prefix=/usr|prefix=\${pcfiledir}/../../..|" {} +
  log "prepare: $(du -sh "$deps" | cut -f1) in $deps (carry it with the working tree)"
}

configure() {  # configure [with_torch]: the no-JIT build; with LibTorch (the PyTorch's) when asked
  local torch_args=(-DLUNAJIT_WITH_TORCH=OFF) prefix="$deps/usr"
  if [[ ${1:-} == with_torch ]]; then
    local torch_prefix
    torch_prefix=${TORCH_PREFIX:-$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')}
    torch_args=(-DLUNAJIT_WITH_TORCH=ON "-DLUNAJIT_PYTHON=$(command -v python3)")
    prefix="$prefix;$torch_prefix"
  fi
  local extra=()
  command -v pkg-config >/dev/null || extra+=("-DPKG_CONFIG_EXECUTABLE=$deps/usr/bin/pkgconf")
  local nvcc
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [[ -x $nvcc ]] && extra+=("-DCMAKE_CUDA_COMPILER=$nvcc")
  # fmt header-only: the PyTorch's LibTorch ships its own fmt headers, which can
  # come before the carried ones in a LibTorch translation unit; header-only
  # code links to no libfmt, so the two versions cannot mismatch at link time.
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLUNAJIT_HOST_JIT=OFF \
    -DCMAKE_CXX_FLAGS=-DFMT_HEADER_ONLY "${torch_args[@]}" "${extra[@]}" -DCMAKE_PREFIX_PATH="$prefix"
}

# Every kernel the GPU runs against the double reference: `lunajit run --check`
# forward and backward, several specs in parallel (each its own process).
checks() {
  local specs=(
    '{"family":"luna","dtype":"bf16","causal":false}' '{"family":"luna","dtype":"bf16","causal":true}'
    '{"family":"luna","dtype":"fp16","causal":false}' '{"family":"luna","dtype":"fp16","causal":true}'
    '{"family":"luna","dtype":"fp32","causal":false}' '{"family":"luna","dtype":"fp32","causal":true}'
    '{"family":"elu","dtype":"bf16","causal":true}' '{"family":"performer","dtype":"bf16","causal":false}'
    '{"family":"performer","dtype":"bf16","causal":true}' '{"family":"hedgehog","dtype":"bf16","causal":true}'
    '{"family":"cosformer","dtype":"bf16","causal":true}' '{"family":"slay","dtype":"bf16","causal":false}'
    '{"family":"t2r","dtype":"bf16","causal":true}' '{"family":"rff","dtype":"fp32","causal":false}')
  local jobs=() spec pass
  for spec in "${specs[@]}"; do
    for pass in "" --backward; do jobs+=("$spec|$pass|--batch 2 --heads 3 --seq 300"); done
  done
  # Long causal walks (16 ranges of 16 chunks) and a length that is no multiple of any tile.
  jobs+=('{"family":"luna","dtype":"bf16","causal":true}|--backward|--batch 1 --heads 2 --seq 4097')
  jobs+=('{"family":"luna","dtype":"bf16","causal":true}||--batch 1 --heads 2 --seq 4097')
  printf '%s\n' "${jobs[@]}" | xargs -P 8 -I{} -d '\n' bash -c '
    IFS="|" read -r spec pass shape <<<"$1"
    log=$(mktemp)
    if "$2" run "$spec" --backend "${GPU_CHECK_BACKEND:-cuda}" --check $pass $shape >"$log" 2>&1; then r=PASS; else r=FAIL; fi
    { echo "$r $spec $pass $shape"; sed "s/^/    /" "$log"; } >"$log.done"
    cat "$log.done"; rm -f "$log" "$log.done"' _ {} "$build/apps/lunajit" >"$work/checks.txt"
  ! grep -q '^FAIL' "$work/checks.txt" && grep -q '^PASS' "$work/checks.txt"
}

# Compute-sanitizer on the default spec's kernels at a small size (memcheck,
# racecheck: the device-side counterpart of the host emulator's sanitizer).
sanitize() {
  local cs
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [[ -x $cs ]] || { echo "no compute-sanitizer"; return 1; }
  local rc=0 spec tool pass
  for spec in '{"family":"luna","dtype":"bf16","causal":true}' '{"family":"luna","dtype":"bf16","causal":false}'; do
    for pass in --backward ""; do
      for tool in racecheck memcheck; do
        echo "== $tool $spec $pass"
        "$cs" --tool "$tool" --error-exitcode 9 "$build/apps/lunajit" run "$spec" --backend cuda $pass \
          --batch 1 --heads 2 --seq 130 || rc=1
      done
    done
  done
  return $rc
}

# Where the cycles go (the backward measured ~10x its cost model on the H200,
# 2026-12-04, and no host tool can say why): Nsight Compute on every kernel
# launch of one default-spec forward + backward at B 8, H 12, N 4096, causal
# and not, with the sections that answer it (stable section names, no raw
# metric names that differ between versions): speed of light, occupancy,
# launch statistics, warp stall reasons, shared-memory wavefronts and bank
# conflicts (MemoryWorkloadAnalysis_Tables), pipe utilisation. CSV per
# variant into profile/. Fails (logged) where the image has no ncu or the
# container denies the performance counters (ERR_NVGPUCTRPERM).
profile() {
  local ncu
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  [[ -x $ncu ]] || { echo "no ncu"; return 1; }
  mkdir -p "$work/profile"
  local rc=0 causal
  for causal in false true; do
    echo "== ncu, default LUNA bf16, causal $causal"
    "$ncu" --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --launch-count 24 \
      --csv --page details "$build/apps/lunajit" run "{\"family\":\"luna\",\"dtype\":\"bf16\",\"causal\":$causal}" \
      --backend cuda --backward --batch 8 --heads 12 --seq 4096 >"$work/profile/causal_$causal.csv" || rc=1
    tail -3 "$work/profile/causal_$causal.csv"
  done
  return $rc
}

# Why the Python path fails, when it does: each step alone, then the failing
# one under cuda-gdb (which debugs host code there) for a native backtrace.
diag_python() {
  export PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1 PYTHONPATH=$build/python
  cat >"$work/repro.py" <<'EOF'
import torch
print("torch", torch.__version__, torch.cuda.is_available(), flush=True)
import lunajit
print("lunajit imported", flush=True)
spec = lunajit.make_spec(family="luna", causal=True, dtype="bf16")
params = lunajit.init_feature_params(spec, 2).cuda()
print("params", params.shape, flush=True)
q, k, v = (torch.randn(1, 130, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = lunajit.linear_attention(q, k, v, spec=spec, params=params, path="aten")
print("aten ok", flush=True)
o2 = lunajit.linear_attention(q, k, v, spec=spec, params=params, path="cuda_kernels")
torch.cuda.synchronize()
print("cuda_kernels ok, rel diff", ((o2.float() - o.float()).norm() / o.float().norm()).item(), flush=True)
EOF
  if python3 "$work/repro.py"; then return 0; fi
  echo "== the same under cuda-gdb"
  local gdb
  gdb=$(command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
  "$gdb" -q -batch -ex run -ex bt -ex 'info sharedlibrary' --args python3 "$work/repro.py" 2>&1 | grep -v '^\[New Thread\|^\[Thread'
  return 1
}

run_gpu() {
  [[ -d $deps ]] || { log "no $deps: run 'bench/gpu_check.sh prepare' on the development machine and carry it"; exit 1; }
  work=${GPU_CHECK_WORK:-/tmp/gpu-check-work}
  rm -rf "$work"
  mkdir -p "$work" "$out"
  : >"$work/stages.jsonl"
  { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv; nproc;
    python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; c++ --version | head -1;
    cmake --version | head -1; } >"$work/device.txt" 2>&1 || true
  export LD_LIBRARY_PATH=$(find "$deps" -name '*.so*' -printf '%h\n' | sort -u | tr '\n' ':')${LD_LIBRARY_PATH:-}
  # The kernel cache must be a directory only this user can write (the cache refuses others).
  export LUNAJIT_CACHE_DIR=$work/kernel-cache
  export root build deps work
  export -f log configure checks sanitize diag_python profile
  mkdir -p -m 700 "$LUNAJIT_CACHE_DIR"
  failed=0
  local with_torch=1
  stage configure 90 configure with_torch
  if ! grep -q '"configure", "ok": true' "$work/stages.jsonl"; then
    with_torch=0
    rm -rf "$build"
    stage configure_without_torch 60 configure
  fi
  grep -q 'LUNAJIT_TORCH_CUDA:INTERNAL=ON' "$build/CMakeCache.txt" 2>/dev/null || with_torch=0
  local first=(lunajit nvrtc_tests) later=(decode_bench)
  ((with_torch)) && first+=(lunajit_torch_shared torch_binding_tests) && later+=(attention_bench)
  stage build 240 cmake --build "$build" --target "${first[@]}" -- -k 0
  # The rest builds behind the GPU stages (separate targets; ninja is not run twice at once).
  (nice cmake --build "$build" --target "${later[@]}" -- -k 0 >"$work/build_later.log" 2>&1; echo "exit $?" >>"$work/build_later.log") &
  local later_pid=$!
  local arch
  arch=$(python3 -c 'import torch; c=torch.cuda.get_device_capability(); print(f"sm_{c[0]}{c[1]}")' 2>/dev/null || echo sm_90)
  stage checks 90 checks
  local py_ok=0
  if ((with_torch)); then
    stage diag_python 75 diag_python
    grep -q '"diag_python", "ok": true' "$work/stages.jsonl" && py_ok=1
  fi
  if ((py_ok)); then
    stage bench 150 env PYTHONPATH="$build/python" python3 "$root/bench/gpu_bench.py" --out "$work" --seqs 1024,4096,16384
  else
    stage bench_sdpa_only 60 python3 "$root/bench/gpu_bench.py" --out "$work" --seqs 1024,4096,16384 --no-lunajit
  fi
  stage report 75 "$build/apps/lunajit" report --arch "$arch" --shapes "8,12,4096;8,12,16384" --causal both --out "$work/report"
  stage profile 120 profile
  stage gpu_tests 45 "$build/tests/runtime_nvrtc/nvrtc_tests" --gtest_filter='*Cuda*:*Gpu*' --gtest_brief=1
  stage sanitizer 90 sanitize
  if ((with_torch)); then  # unbuffered: a test killed at the limit still shows how far it got
    stage torch_gpu_tests 75 stdbuf -o0 -e0 "$build/tests/torch_binding/torch_binding_tests" --gtest_filter='*Gpu*'
  fi
  stage tune 60 "$build/apps/lunajit" tune --backend cuda --shapes 8,12,16384 --json --quiet
  if ((with_torch)); then
    stage wait_build_later 60 bash -c "while kill -0 $later_pid 2>/dev/null; do sleep 1; done; grep -q 'exit 0' '$work/build_later.log'"
    ((py_ok)) && stage bench_64k 90 env PYTHONPATH="$build/python" python3 "$root/bench/gpu_bench.py" \
      --out "$work/bench_64k" --seqs 65536 --repeats 3
    stage cpp_bench 90 "$build/bench/attention_bench" --benchmark_out="$work/attention_bench.json" \
      --benchmark_out_format=json --benchmark_min_time=0.05
  fi
  stage decode 30 env LUNAJIT_BACKEND=cuda "$build/bench/decode_bench" \
    --benchmark_filter='BM_DecodeStep/[0-9]+/(1|64)$|BM_FullCausalForwardOverPrefix/[0-9]+/1$' \
    --benchmark_out="$work/decode_bench.json" --benchmark_out_format=json
  kill "$later_pid" 2>/dev/null || true
  pack
  log "results in $out (summary.md, results.tar.gz: logs, gpu_bench.md/json, checks.txt, report/, stages.jsonl)"
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
  # The profile stage's command line, through a stub ncu that prints its
  # arguments one a line: the spec reaches lunajit as one JSON argument.
  local stub
  stub=$(mktemp -d)
  printf '#!/usr/bin/env bash\nprintf "%%s\\n" "$@"\n' >"$stub/ncu"
  chmod +x "$stub/ncu"
  (PATH=$stub:$PATH work=$stub build=$stub/build profile >/dev/null) || { log "dry run: profile failed with a stub ncu"; failed=1; }
  for causal in false true; do
    grep -qxF "{\"family\":\"luna\",\"dtype\":\"bf16\",\"causal\":$causal}" "$stub/profile/causal_$causal.csv" ||
      { log "dry run: profile's spec argument (causal $causal)"; failed=1; }
  done
  rm -rf "$stub"
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
  run) run_gpu ;;
  --dry-run) dry_run ;;
  *) echo "usage: bench/gpu_check.sh prepare | run | --dry-run" >&2; exit 2 ;;
esac
