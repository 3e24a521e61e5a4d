# fiber: the two commands are `make run` and `make test`.
#
#   make            build into build/ (programs in build/bin/)
#   make deps       install missing Debian packages
#   make run        build, then run the main example on the local backend
#   make test       build, then run every test (ctest)
#   make test-asan  the whole suite again under ASan + UBSan (build-asan/)
#   make fuzz       build the libFuzzer targets with clang and run each
#                   for FUZZ_SECONDS (default 60)
#   make bench      build, then run the benchmarks
#   make install    install to PREFIX (default /usr/local), honours DESTDIR
#   make clean      remove build directories

PREFIX ?= /usr/local
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SECONDS ?= 60
CTEST_ARGS ?=

.PHONY: all deps build run test test-asan fuzz bench install clean

all: build

deps:
	@scripts/deps.sh build

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	FIBER_BACKEND=local $(BUILD)/bin/es --env cartpole

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

test-asan: deps
	cmake -S . -B build-asan -DFIBER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -E '^install\.' $(CTEST_ARGS)

fuzz:
	@scripts/deps.sh fuzz
	CC=clang cmake -S . -B build-fuzz -DFIBER_FUZZ=ON -DBUILD_TESTING=OFF \
	  -DCMAKE_BUILD_TYPE=Debug
	cmake --build build-fuzz -j $(JOBS) --target fuzz_wire
	mkdir -p build-fuzz/corpus/wire
	build-fuzz/bin/fuzz_wire -max_total_time=$(FUZZ_SECONDS) \
	  -print_final_stats=1 build-fuzz/corpus/wire tests/fuzz/corpus/wire

bench: build
	$(BUILD)/bin/bench-spawn

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) build-asan build-fuzz
