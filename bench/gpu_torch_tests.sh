#!/usr/bin/env bash
# GPU checks of the LibTorch binding (torch_binding_tests' Gpu* tests: CUDA
# kernel path vs ATen path, forward and gradients of every family, bf16 on a
# non-default stream, a module training step). On a machine without a GPU they
# skip with "no CUDA GPU / Torch built without CUDA".
#
# Needs a CUDA build of LibTorch with the C++11 ABI (e.g. the one inside a
# PyTorch >= 2.6 CUDA wheel): its CMake config is found through
# torch.utils.cmake_prefix_path, or set TORCH_PREFIX to the directory holding
# Torch/TorchConfig.cmake's parent. When bench/gpu_check.sh exists it should
# call this script in its torch section.
#
#   bench/gpu_torch_tests.sh [BUILD_DIR]     (default build-torch-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-torch-gpu}
prefix=${TORCH_PREFIX:-$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$prefix" \
      -DLUNAJIT_WITH_TORCH=ON -DLUNAJIT_BUILD_BENCH=OFF
grep -q 'LUNAJIT_TORCH_CUDA:INTERNAL=ON' "$build/CMakeCache.txt" ||
  { echo "gpu_torch_tests: the LibTorch at $prefix has no CUDA" >&2; exit 1; }
cmake --build "$build" --target torch_binding_tests train_luna_example -j "$(nproc)"
export LUNAJIT_CACHE_DIR=${LUNAJIT_CACHE_DIR:-$PWD/$build/kernel-cache}
"$build/tests/torch_binding/torch_binding_tests" --gtest_filter='*Gpu*:*HostKernelPath*' --gtest_brief=1
