# lunajit: the two commands.
#   make demo   generate, compile, validate (host) or tune (GPU), report: the main job on its defaults
#   make test   install what is missing, build, run the whole test suite
#               (then the fuzz and sanitizer checks below, at CI size)
# Fuzzing and sanitizers (README "Fuzzing and sanitizer builds"):
#   make fuzz-test   clang-19 libFuzzer targets in build-fuzz/, each FUZZ_SECONDS (ctest -L fuzz)
#   make asan-test   g++ ASan+UBSan build in build-asan/, the ASAN_TESTS subset of the suite
BUILD_DIR ?= build
# -O2 without debug info: -g doubled the compile time of a LibTorch translation
# unit here (the build is most of a cold `make test`). For a debuggable build:
# make test BUILD_TYPE=RelWithDebInfo (-O2 -g) or BUILD_TYPE=Debug.
BUILD_TYPE ?= Release
RELEASE_FLAGS = -O2 -DNDEBUG
JOBS ?= $(shell nproc)
# CI runs the exhaustive sweeps at reduced size; LUNAJIT_SWEEP=full runs them whole.
export LUNAJIT_SWEEP ?= reduced
# Kernels compiled during a test run are cached here, so each compiles once
# (`make demo` uses the user's cache: LUNAJIT_CACHE_DIR or ~/.cache/lunajit).
test: export LUNAJIT_CACHE_DIR ?= $(CURDIR)/$(BUILD_DIR)/kernel-cache

.PHONY: deps configure build test demo clean fuzz fuzz-test asan asan-test

deps:
	@bash scripts/install_deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DCMAKE_CXX_FLAGS_RELEASE="$(RELEASE_FLAGS)" -DCMAKE_C_FLAGS_RELEASE="$(RELEASE_FLAGS)" > /dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 1200
	@$(MAKE) --no-print-directory fuzz-test asan-test

demo: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target lunajit
	$(BUILD_DIR)/apps/lunajit demo

clean:
	rm -rf $(BUILD_DIR)

# ---- fuzzing: the parsers under libFuzzer + ASan + UBSan (tests/fuzz)
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 20

fuzz: deps
	@cmake -S . -B $(FUZZ_DIR) -G Ninja -DLUNAJIT_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 -DLUNAJIT_FUZZ_SECONDS=$(FUZZ_SECONDS) > /dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS)

fuzz-test: fuzz
	cd $(FUZZ_DIR) && ctest -L fuzz --output-on-failure -j $(JOBS)

# ---- ASan + UBSan build of the test suite with g++ (build-asan/)
# CI builds ASAN_TARGETS and runs every test of them except those matching
# ASAN_EXCLUDE (ctest -E; tests of executables not built show as *_NOT_BUILT,
# and their batched suites, cmake/LunajitTesting.cmake, are left out by their
# gtest_batch_<target> label);
# the full run: make asan-test ASAN_TARGETS=all (see README).
ASAN_DIR ?= build-asan
# -g1 (line tables): the reports keep file:line; full -g only slowed the build.
ASAN_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
# --as-needed: with the sanitizers g++ otherwise records libcuda.so.1 (the link-time
# stub) as needed, and the runtime tests fail to start on a machine without a driver.
ASAN_TARGETS ?= codegen_tests cache_tests reference_tests
# Tests registered with plain add_test (pytest, the install tree, the sanitized
# sweep) name no gtest binary, so they never show as _NOT_BUILT: list them here.
ASAN_EXCLUDE ?= _NOT_BUILT|^python_|^install_|^tuner_sweep_sanitized$$|^state_host_sanitized$$|^gpu_check_dry_run$$
export ASAN_OPTIONS ?= detect_leaks=1
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1

asan: deps
	@cmake -S . -B $(ASAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLUNAJIT_BUILD_BENCH=OFF \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
	  -DCMAKE_CXX_FLAGS="$(ASAN_FLAGS)" -DCMAKE_C_FLAGS="$(ASAN_FLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="$(ASAN_FLAGS) -Wl,--as-needed" -DCMAKE_SHARED_LINKER_FLAGS="$(ASAN_FLAGS)" > /dev/null
	@cmake --build $(ASAN_DIR) -j $(JOBS) --target $(ASAN_TARGETS)

asan-test: export LUNAJIT_CACHE_DIR ?= $(CURDIR)/$(ASAN_DIR)/kernel-cache
asan-test: asan
	cd $(ASAN_DIR) && ex=$$(ctest --print-labels | sed -n 's/^ *\(gtest_batch_[A-Za-z0-9_]*\)$$/\1/p' | \
	  while read -r l; do case " $(ASAN_TARGETS) " in *" $${l#gtest_batch_} "*|*" all "*) ;; \
	  *) printf '|^%s$$' "$$l";; esac; done) && \
	  ctest --output-on-failure -j $(JOBS) --timeout 1200 -E '$(ASAN_EXCLUDE)' $${ex:+-LE "$${ex#|}"}
