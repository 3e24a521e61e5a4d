# fiber: the two commands are `make run` and `make test`.
#
#   make            build into build/ (programs in build/bin/)
#   make deps       install missing Debian packages
#   make engines    install the test clusters' packages (Slurm, etcd, Go...)
#                   and build the Kubernetes binaries once (scripts/deps.sh
#                   engines; 5.5 to 15 minutes the first time, then cached in
#                   /var/cache/fiber-k8s), before any test runs
#   make run        build, then run the main example on the local backend
#   make test       build and engines, then run every test (ctest), then
#                   list how many passed, failed and were skipped, and why
#                   (tests/skip_summary.py).  A case that cannot run here
#                   (no Docker Engine, no cluster) is skipped: exit 77,
#                   SKIP_RETURN_CODE, never counted as passed.  With CI=true
#                   (.ci/run) an engine case that cannot run fails instead.
#   make test-asan  the whole suite again under ASan + UBSan (build-asan/)
#   make fuzz       build the libFuzzer targets with clang and run each
#                   for FUZZ_SECONDS (default 60): the wire decoder and the
#                   message handlers (FUZZ_TARGETS; docs/reliability.md)
#   make valgrind   the test cases under valgrind memcheck, children
#                   included (build-vg/); VALGRIND_TESTS='regex' picks cases
#   make valgrind-ci  the subset CI runs (VALGRIND_CI_TESTS)
#   make python     build the Python package in place (python/fiber/_fiber*.so)
#                   in the virtual environment build/venv
#   make test-python  its pytest suite (also part of make test)
#   make python-examples  the package, and build/venv-examples with the
#                   Python examples' environments (MuJoCo, Box2D), matplotlib, Ray
#   make wheel      a manylinux wheel of the Python package in
#                   build/wheelhouse (scripts/wheel.sh: pip wheel, auditwheel)
#   make bench      build, then run the benchmarks
#   make install    install to PREFIX (default /usr/local), honours DESTDIR
#   make clean      remove build directories

PREFIX ?= /usr/local
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= wire objsrv objclient pool worker ring blobs gate
CTEST_ARGS ?=
# make valgrind: which cases (a regex over ctest names; empty: all but
# those scripts/valgrind.py skips), and the subset CI runs: the unit
# suites, every fuzz corpus replayed through its message handlers, and the
# process, pool, queue, manager, ring and security suites (about 8 minutes
# on 2 cores; the cluster reruns, the tool and the examples are left out).
VALGRIND_TESTS ?=
VALGRIND_CI_TESTS ?= ^(test_wire|test_config|test_core|test_process|test_pool|test_queue|test_manager|test_ring|test_security|test_secure|es|fuzz_[a-z]+)\.

VENV ?= $(BUILD)/venv
PYTEST_ARGS ?=

.PHONY: all deps engines build run test test-asan fuzz valgrind valgrind-ci \
	bench install clean python test-python python-examples wheel

all: build

deps:
	@scripts/deps.sh build

engines:
	@scripts/deps.sh engines

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	FIBER_BACKEND=local $(BUILD)/bin/es --env cartpole

# ctest's exit status is the verdict; skip_summary.py only reports.
CTEST_RUN = ctest --output-on-failure -j $(JOBS) --output-junit ctest-results.xml
SKIP_SUMMARY = python3 $(CURDIR)/tests/skip_summary.py ctest-results.xml

# `make test` runs ctest (the C suites, the engine reruns, the Python
# suite's slurm and docker reruns), then the Python suite on the local
# backend; either failing fails it.
test: build engines python
	cd $(BUILD) && { $(CTEST_RUN) $(CTEST_ARGS); rc=$$?; $(SKIP_SUMMARY); exit $$rc; }
	$(MAKE) --no-print-directory test-python

# The extension links the libfiber.a CMake just built; `pip install
# ./python` builds the same extension from libfiber's sources instead.
python: build
	@scripts/python-env.sh $(VENV)
	cd python && FIBER_STATIC_LIB=$(abspath $(BUILD))/lib/libfiber.a \
	  $(abspath $(VENV))/bin/python setup.py -q build_ext --inplace \
	  --build-temp $(abspath $(BUILD))/python-temp

python-examples: python
	@scripts/examples-env.sh $(BUILD)/venv-examples

test-python: python
	cd python && PYTHONPATH=$(CURDIR)/python $(abspath $(VENV))/bin/python \
	  -m pytest -q -p no:cacheprovider tests $(PYTEST_ARGS)

# The whole suite but install.* (it installs the normal build) and
# python.* (the extension is not built with the sanitizers).  es_requeue.*
# (the ES runs requeued by Slurm at its time limit and by Kubernetes after
# a pod deletion) runs here too: its training now ends a fixed number of
# iterations after the wanted resume, so it is requeued twice, not four or
# seven times as when a slow ASan build ran a fixed 5,000 iterations.
test-asan: deps engines
	cmake -S . -B build-asan -DFIBER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
	cmake --build build-asan -j $(JOBS)
	cd build-asan && { ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(CTEST_RUN) -E '^(install|python)\.' $(CTEST_ARGS); rc=$$?; \
	  $(SKIP_SUMMARY); \
	  exit $$rc; }

# One libFuzzer process at a time, each target for FUZZ_SECONDS; what a
# target finds goes to build-fuzz/corpus/<t> (its seeds stay in
# tests/fuzz/corpus/<t>), a crash to build-fuzz/fuzz_<t>-crash-*.
fuzz:
	@scripts/deps.sh fuzz
	CC=clang cmake -S . -B build-fuzz -DFIBER_FUZZ=ON -DBUILD_TESTING=OFF \
	  -DCMAKE_BUILD_TYPE=Debug
	cmake --build build-fuzz -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t; \
	  echo "== fuzz_$$t: $(FUZZ_SECONDS) s"; \
	  build-fuzz/bin/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) \
	    -print_final_stats=1 -artifact_prefix=build-fuzz/fuzz_$$t- \
	    build-fuzz/corpus/$$t tests/fuzz/corpus/$$t || exit 1; \
	done

# Valgrind: scripts/valgrind.py runs each case's command under memcheck
# with --trace-children=yes (workers and other children are checked too)
# and timeouts scaled by VALGRIND_TIMEOUT_SCALE (20); a leak that is
# definitely or indirectly lost fails the case.
valgrind:
	@scripts/deps.sh valgrind
	cmake -S . -B build-vg -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build build-vg -j $(JOBS)
	scripts/valgrind.py build-vg '$(VALGRIND_TESTS)'

valgrind-ci:
	$(MAKE) valgrind VALGRIND_TESTS='$(VALGRIND_CI_TESTS)'

wheel: deps
	scripts/wheel.sh $(BUILD)/wheelhouse

bench: build
	$(BUILD)/bin/bench-spawn

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) build-asan build-fuzz build-vg
