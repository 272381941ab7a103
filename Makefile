# ptrain: the two commands a newcomer needs are `make run` and `make test`.
# `make test-long` runs the long tests (recipes trained to their accuracy,
# exactness sweeps over many layouts, the scale tests), which CI runs after
# `make test` (.ci/run).
#
# TORCH picks the libtorch (docs/building.md):
#   debian  Debian's libtorch 1.13, CPU only (the default)   build folder build/
#   pypi    PyTorch 2.x from PyPI, with CUDA, in .venv-torch/ build folder build-pypi/
TORCH ?= debian
JOBS  ?= 2
CMAKE_ARGS ?=
ifeq ($(TORCH),debian)
  BUILD ?= build
  DEPS_ARGS :=
  TORCH_CMAKE_ARGS :=
else ifeq ($(TORCH),pypi)
  BUILD ?= build-pypi
  DEPS_ARGS := --pypi
  # Evaluated when configuring, after `deps` made the environment.
  TORCH_CMAKE_ARGS = -DCMAKE_PREFIX_PATH="$$(tools/torch-cmake-prefix.sh)"
else
  $(error TORCH=$(TORCH): expected debian or pypi)
endif

# `make bench` runs every section; `make bench scale` (or any of these names
# after `bench`) only those.
BENCH_SECTIONS := eager tensor pipeline fusion moe memory shares calibration recommender scale

.PHONY: all deps configure build test test-long run bench clean $(BENCH_SECTIONS)

all: build

deps:
	@tools/install-deps.sh $(DEPS_ARGS)

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(TORCH_CMAKE_ARGS) $(CMAKE_ARGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# ctest's results also go to a JUnit file, which tools/ci/test_times.py turns
# into tables of where the time went.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE long --output-junit test-results.xml

test-long: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L long --output-junit test-results-long.xml

run: build
	$(BUILD)/bin/ptrain run configs/quickstart.yaml

bench: build
	cmake --build $(BUILD) -j $(JOBS) --target ptrain_bench
	$(BUILD)/bin/ptrain_bench $(filter $(BENCH_SECTIONS),$(MAKECMDGOALS))

$(BENCH_SECTIONS):
	@:

clean:
	rm -rf $(BUILD)
