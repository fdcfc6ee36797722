# The two commands: `make demo` and `make test`. Each installs what is missing,
# configures into build/, builds, then runs.
JOBS ?= $(shell nproc)
BUILD := build

.PHONY: demo test build setup configure asan cuda fuzz clean

setup:
	@./scripts/setup

configure: setup
	@cmake --preset default > /dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	./scripts/demo

# On failure, the failed tests' output is printed again at the end, where a cut log keeps it.
test: build
	cd $(BUILD) && OMP_NUM_THREADS=1 ctest --output-on-failure -j $(JOBS) --timeout 600 || \
	  { $(CURDIR)/scripts/failed_test_output .; exit 1; }

asan: setup
	cmake --preset asan > /dev/null && cmake --build build-asan -j $(JOBS) && \
	  cd build-asan && OMP_NUM_THREADS=1 ctest --output-on-failure -j $(JOBS)

# Compiles and links everything with CUDA and NCCL (nothing runs: no GPU needed).
cuda: setup
	@PATH="$$PATH:/usr/local/cuda/bin" cmake --preset cuda > /dev/null && cmake --build build-cuda -j $(JOBS)

# libFuzzer targets (clang, torch-free), each run for FUZZ_SECONDS.
FUZZ_SECONDS ?= 60
fuzz: setup
	@./scripts/fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) build-asan build-cuda build-fuzz
