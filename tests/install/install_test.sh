#!/usr/bin/env bash
# The installed package, as the README's "Install" and "Use from your CMake
# project" sections tell a user to use it. Run by ctest (tests/install/CMakeLists.txt):
#   install_test.sh install   BUILD DIR PYTHON   cmake --install BUILD --prefix DIR/prefix; the CLI runs
#   install_test.sh consumer  BUILD DIR PYTHON   configure, build, run tests/install/consumer against it
#   install_test.sh python    BUILD DIR PYTHON   import the installed package: the op and its gradient
#   install_test.sh buildtree BUILD DIR PYTHON   the same from the package staged in BUILD/python
#   install_test.sh pip       BUILD DIR PYTHON   pip install --no-build-isolation --no-deps BUILD/python; import
set -euo pipefail
step=$1 build=$2 dir=$3 python=$4
here=$(cd "$(dirname "$0")" && pwd)
prefix=$dir/prefix
# The op and its gradient from Python, with only the path setup the README shows
# (README "Python": keep the two in step).
check_import='
import torch, lunajit
q = torch.randn(2, 64, 4, 16, requires_grad=True)
o = lunajit.linear_attention(q, q, q, family="luna", causal=True)
o.sum().backward()
assert o.shape == (2, 64, 4, 16) and q.grad.abs().sum() > 0
print("import ok:", lunajit.LIBRARY_PATH)
'
case $step in
  install)
    rm -rf "$prefix"
    cmake --install "$build" --prefix "$prefix" > "$dir/install.log"
    for f in bin/lunajit lib/liblunajit.so lib/liblunajit_torch.so lib/cmake/lunajit/lunajitConfig.cmake \
             include/lunajit/torch_binding/modules.h include/lunajit/lunajit/kernel_args.cuh \
             lib/python3/dist-packages/lunajit/__init__.py; do
      [[ -e $prefix/$f ]] || { echo "not installed: $f" >&2; exit 1; }
    done
    "$prefix/bin/lunajit" spec --family luna --json > /dev/null
    echo "installed into $prefix"
    ;;
  consumer)
    rm -rf "$dir/consumer-build"
    launcher=()
    command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    cmake -S "$here/consumer" -B "$dir/consumer-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
          -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" > "$dir/consumer-configure.log"
    cmake --build "$dir/consumer-build" -j 2
    "$dir/consumer-build/core_consumer"
    "$dir/consumer-build/torch_consumer"
    ;;
  python)
    out=$(cd "$dir" && PYTHONPATH="$prefix/lib/python3/dist-packages" "$python" -c "$check_import")
    echo "$out"
    [[ $out == *"$prefix/lib/liblunajit_torch.so"* ]] || { echo "loaded the library from elsewhere" >&2; exit 1; }
    ;;
  buildtree)
    out=$(cd "$dir" && PYTHONPATH="$build/python" "$python" -c "$check_import")
    echo "$out"
    [[ $out == *"$build/python/lunajit/liblunajit_torch.so"* ]] || { echo "loaded the library from elsewhere" >&2; exit 1; }
    ;;
  pip)
    rm -rf "$dir/pip-target"
    "$python" -m pip install --no-build-isolation --no-deps --no-index --target "$dir/pip-target" "$build/python" \
      > "$dir/pip.log"
    out=$(cd "$dir" && PYTHONPATH="$dir/pip-target" "$python" -c "$check_import")
    echo "$out"
    [[ $out == *"$dir/pip-target/lunajit/liblunajit_torch.so"* ]] || { echo "loaded the library from elsewhere" >&2; exit 1; }
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
