# ptrain: the two commands a newcomer needs are `make run` and `make test`.
BUILD ?= build
JOBS  ?= 2
CMAKE_ARGS ?=

.PHONY: all deps configure build test run bench clean

all: build

deps:
	@tools/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

run: build
	$(BUILD)/bin/ptrain run configs/quickstart.yaml

bench: build
	cmake --build $(BUILD) -j $(JOBS) --target ptrain_bench
	$(BUILD)/bin/ptrain_bench

clean:
	rm -rf $(BUILD)
