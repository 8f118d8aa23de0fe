# trainplan's two set-up commands (see README.md):
#   make run   installs the few Debian packages the planner needs (when missing), builds only the
#              `trainplan` planner binary in $(RUN_BUILD)/, and runs the main job on the built-in default
#   make test  installs everything (test tools, LibTorch for exec/, Chromium, the Python binding's
#              tools), builds everything in $(BUILD)/ (the planner, the executor trainplan-exec, all
#              tests and benchmarks, the Python module), and runs all tests with ctest
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
# ccache is installed by `deps`, so look for it when the recipe runs, not when make reads this file.
LAUNCHER = $$(command -v ccache >/dev/null 2>&1 && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

.PHONY: run test test-asan fuzz deps deps-planner build build-planner bench bench-cold bench-gpu sweep-engines clean

deps:
	@bash cmake/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(LAUNCHER) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

# The planner alone, for a first run: no exec/ (LibTorch), no tests or benchmarks, the libraries as
# unity sources at -O2 (CMakeLists.txt, TRAINPLAN_UNITY), only the `trainplan` target. Its own build
# folder, so that `make test` afterwards keeps its full configuration. The executor
# (`trainplan exec|calibrate`, LibTorch) is built by `make build` or `make test` in $(BUILD)/.
RUN_BUILD ?= build-run
deps-planner:
	@bash cmake/install-deps.sh planner

build-planner: deps-planner
	@cmake -S . -B $(RUN_BUILD) -DCMAKE_BUILD_TYPE=Release -DTRAINPLAN_WITH_EXEC=OFF -DTRAINPLAN_TESTS=OFF -DTRAINPLAN_PYTHON=OFF \
	  -DTRAINPLAN_UNITY=ON "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" $(LAUNCHER) >/dev/null
	@cmake --build $(RUN_BUILD) -j$(JOBS) --target trainplan

run: build-planner
	./$(RUN_BUILD)/trainplan search --model llama3-70b --cluster dgx-h100 --gpus 64 --global-batch 512

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 1500

# sim/, reports/, the CLI and all their tests under AddressSanitizer + UndefinedBehaviorSanitizer,
# at -O1 -g1 (CMakeLists.txt), with leak detection; run by .ci/run after `make test`. The LibTorch
# executor is left out (LibTorch is not built with ASan; its tests show as skipped).
ASAN_BUILD ?= build-asan
test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Release -DTRAINPLAN_WITH_EXEC=OFF -DTRAINPLAN_SANITIZE=ON $(LAUNCHER) >/dev/null
	@cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -j$(JOBS) --timeout 1500

# libFuzzer targets for the loaders and the flag parser (clang, installed by deps), FUZZ_SECONDS
# each, or FUZZ_RUNS executions each when given (tests/fuzz/FUZZ_RESULTS.md).
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_RUNS ?=
fuzz: deps
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Release -DTRAINPLAN_WITH_EXEC=OFF -DTRAINPLAN_FUZZ=ON $(LAUNCHER) >/dev/null
	@cmake --build $(FUZZ_BUILD) -j$(JOBS)
	FUZZ_RUNS=$(FUZZ_RUNS) bash tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

bench: build
	./$(BUILD)/tests/trainplan_bench

# Cold start of whole trainplan processes (predict, and search of 530B on 5,128 GPUs), wall time.
bench-cold: build
	./$(BUILD)/tests/trainplan_bench --benchmark_filter=ColdStart

# How far the closed form and the step simulator are apart over every layout search considers, for
# every shipped model, cluster, profile, dtype and attention kind (tests/bench/engine_sweep.cpp).
sweep-engines: build
	./$(BUILD)/tests/trainplan_engine_sweep

# Side-by-side GPU benchmark, on a GPU machine: trainplan exec and a plain-PyTorch step
# (tests/gpu/pytorch_step.py) on the same plans; one JSON with both step times, peak reserved memory
# and the ratios. Needs a CUDA build in $(GPU_BUILD) (cmake -DTRAINPLAN_EXEC_CUDA_MODE=ON on a machine with nvcc).
GPU_BUILD ?= build-gpu
BENCH_GPU_ARGS ?=
bench-gpu:
	python3 tests/gpu/bench_gpu.py --trainplan $(GPU_BUILD)/trainplan $(BENCH_GPU_ARGS)

clean:
	rm -rf $(BUILD) $(RUN_BUILD)
