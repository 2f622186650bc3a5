#!/usr/bin/env bash
# Installs the Debian packages lunajit builds with, only those that are missing (idempotent).
# Called by `make demo` and `make test` before anything is built.
set -euo pipefail

packages=(
  cmake g++ make ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libfmt-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  libboost-context-dev libxxhash-dev
  llvm-19-dev libclang-19-dev libclang-cpp19-dev clang-19 libzstd-dev
  libclang-rt-19-dev   # libFuzzer and the sanitizer runtimes of clang-19 (make fuzz-test)
  libtorch-dev libopenblas0-pthread zlib1g-dev
  libgloo-dev   # the headers of c10d's ProcessGroupGloo (lunajit_torch_dist: sequence and data parallelism)
  dataset-fashion-mnist   # lunajit-experiment's fmnist-seq and fmnist-vit tasks (IDX files)
  python3-torch python3-pytest python3-setuptools python3-pip   # the Python package and its tests (same torch as libtorch-dev)
  chromium python3-jsonschema libpng-dev   # report tests: headless render, schema check, PNG decode
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "lunajit: missing Debian packages: ${missing[*]}" >&2
    echo "lunajit: run as root, or: sudo apt-get install --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  echo "lunajit: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
if [[ ! -f "$cuda_root/include/nvrtc.h" ]]; then
  echo "lunajit: the CUDA toolkit (NVRTC headers and library) was not found at $cuda_root." >&2
  echo "lunajit: install the CUDA toolkit (12.x or 13.x) or set CUDAToolkit_ROOT to its location." >&2
  exit 1
fi
