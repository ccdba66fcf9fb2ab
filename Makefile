# nabla quick start:  `make train` trains the default model, `make test` runs every test,
# `make test-quick` the edit-test loop's few minutes of it (docs/testing.md).
# They install missing Debian packages (tools/install-deps), configure and build first; `make
# train` and `make install` build only what they need (the library, the programs).
#   build/       release build (oneDNN GEMM provider when found). The CUDA plugin is built
#                where it can run (nvcc and a GPU driver found); `make cuda` builds it anyway
#                (CUDA=enabled at the first configure: the same; CI does that).
#   build-asan/  AddressSanitizer + UBSan build, run with the OpenBLAS GEMM provider
#   build-fuzz/  clang + libFuzzer + ASan/UBSan: the fuzz targets in fuzz/ (make fuzz)
#   build-tsan/  ThreadSanitizer build of the tests: loader and communicator threads
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_SECONDS ?= 60
MESON_OPTS ?=
CUDA       ?=
NINJA      ?= ninja
PREFIX     ?=

.PHONY: all deps build build-asan cuda train test test-quick test-release test-asan test-tsan fuzz bench install clean

all: build

deps:
	@bash tools/install-deps

$(BUILD)/build.ninja: | deps
	@# the CUDA compiler is tools/nvcc-md: nvcc with header dependency files (see the script)
	mkdir -p $(BUILD) && printf "[binaries]\ncuda = '%s/tools/nvcc-md'\n" "$(CURDIR)" >$(BUILD)/nvcc-md.ini
	meson setup $(BUILD) --native-file $(BUILD)/nvcc-md.ini $(if $(CUDA),-Dcuda=$(CUDA)) $(MESON_OPTS)

$(ASAN_BUILD)/build.ninja: | deps
	meson setup $(ASAN_BUILD) -Dbuildtype=debug -Doptimization=1 -Db_sanitize=address,undefined \
	    -Db_lundef=false -Dcuda=disabled -Dbench=false $(MESON_OPTS)

build: $(BUILD)/build.ninja
	$(NINJA) -C $(BUILD)

build-asan: $(ASAN_BUILD)/build.ninja
	$(NINJA) -C $(ASAN_BUILD)

# The CUDA plugin (and its host-side tests) even where no GPU driver is found: compiling
# needs only nvcc (docs/cuda.md).
cuda: $(BUILD)/build.ninja
	meson configure $(BUILD) -Dcuda=enabled
	$(NINJA) -C $(BUILD)

# Only the library and the program it runs (not the tests, benchmarks or CUDA plugin).
train: $(BUILD)/build.ninja
	$(NINJA) -C $(BUILD) models/mlp
	./$(BUILD)/models/mlp --epochs 5

# The release suite runs with the default provider (oneDNN when built in), the sanitizer
# suite with OpenBLAS, so both GEMM providers are exercised on every run.
test-release: build
	CK_DEFAULT_TIMEOUT=600 ./$(BUILD)/tests/nabla_tests

test-asan: build-asan
	CK_DEFAULT_TIMEOUT=600 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	    NB_GEMM=openblas ./$(ASAN_BUILD)/tests/nabla_tests

test:
	@bash tools/run-tests $(BUILD) $(ASAN_BUILD)

# The edit-test loop (a few minutes): the release build, the unit suites, one 2-rank MPI run
# and the cheap static checks; no sanitizers, fuzzing or program checks. docs/testing.md.
test-quick:
	@bash tools/run-tests --quick $(BUILD)

# Every fuzz target for FUZZ_SECONDS each (make test runs them 10 s each). A longer run:
# `make fuzz FUZZ_SECONDS=3600` (an hour per target; inputs with new coverage are kept in
# build-fuzz/corpus/ for the next run, failures in build-fuzz/crashes/). docs/testing.md.
fuzz: | deps
	@bash tools/run-fuzz -t $(FUZZ_SECONDS)

# The threaded parts under ThreadSanitizer (part of make test). docs/testing.md.
test-tsan: | deps
	@bash tools/run-tsan $(TSAN_BUILD)

bench: build
	./$(BUILD)/bench/bench_kernels

# `make install` builds what it installs (the libraries, the CUDA plugin when configured, the
# programs; not the tests or benchmarks) and installs it into the build's prefix (meson's
# default /usr/local);
# `make install PREFIX=/opt/nabla` sets the build's prefix to that folder first (it stays
# set for later installs). Programs built with `pkg-config --cflags --libs nabla` find the
# library there without LD_LIBRARY_PATH (nabla.pc carries an rpath).
install: $(BUILD)/build.ninja
	$(if $(PREFIX),meson configure $(BUILD) -Dprefix=$(abspath $(PREFIX)) &&) $(NINJA) -C $(BUILD) build.ninja
	$(NINJA) -C $(BUILD) $$(meson introspect $(BUILD) --targets | python3 -c '$(INSTALLED_PY)' $(BUILD))
	meson install -C $(BUILD) --no-rebuild

# the build's targets that meson installs, as ninja names them (paths in the build folder)
INSTALLED_PY = import json, os, sys; d = os.path.abspath(sys.argv[1]); print(" ".join(os.path.relpath(f, d) for t in json.load(sys.stdin) if t["installed"] for f in t["filename"]))

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) build-fuzz
