# lunajit: the two commands.
#   make demo   generate, compile, validate (host) or tune (GPU), report: the main job on its defaults
#   make test   install what is missing, build, run the whole test suite
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
# CI runs the exhaustive sweeps at reduced size; LUNAJIT_SWEEP=full runs them whole.
export LUNAJIT_SWEEP ?= reduced
# Kernels compiled during a test run are cached here, so each compiles once
# (`make demo` uses the user's cache: LUNAJIT_CACHE_DIR or ~/.cache/lunajit).
test: export LUNAJIT_CACHE_DIR ?= $(CURDIR)/$(BUILD_DIR)/kernel-cache

.PHONY: deps configure build test demo clean

deps:
	@bash scripts/install_deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) > /dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 1200

demo: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target lunajit
	$(BUILD_DIR)/apps/lunajit demo

clean:
	rm -rf $(BUILD_DIR)
