# The fuzz build (LUNAJIT_FUZZ=ON, included by the top-level CMakeLists.txt):
# clang-19 with -fsanitize=fuzzer-no-link,address,undefined on the components
# the parsers live in, and the libFuzzer targets of tests/fuzz. No LLVM
# libraries, runtime, GoogleTest or benchmarks. `make fuzz` configures it in
# build-fuzz/ with CXX=clang++-19; `make fuzz-test` runs ctest -L fuzz there.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "LUNAJIT_FUZZ needs clang with libFuzzer (Debian: clang-19 libclang-rt-19-dev): "
                      "-DCMAKE_CXX_COMPILER=clang++-19 -DCMAKE_C_COMPILER=clang-19")
endif()
set(LUNAJIT_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
add_compile_options(-fsanitize=fuzzer-no-link ${LUNAJIT_SANITIZE_FLAGS})
add_link_options(${LUNAJIT_SANITIZE_FLAGS})

add_subdirectory(common)
add_subdirectory(templates)
add_subdirectory(codegen)
add_subdirectory(cache)
add_subdirectory(report)   # lunajit_report_read only (report/CMakeLists.txt stops there)

enable_testing()
add_subdirectory(tests/fuzz)
