# ucxbackend: build, demo, tests.
#
#   make demo        deps + build + 2-rank DDP demo on ucx and gloo, compared
#   make test        deps + build + the whole test suite
#   make test-quick  deps + build + tests not marked slow
#   make build       (re)build ucxbackend/_C in place; ninja recompiles only what changed
#   make lint        ruff, and mypy strict over ucxbackend/
#   make gpu-check   on a CUDA machine: gpu-build, gpu-smoke, gpu-tests in turn (stops at a failure)
#   make gpu-build   checks (CUDA torch, UCX, a GPU), build with GPU_CXX (no deps step), the link
#                    tests, info
#   make gpu-smoke   scripts/gpu_smoke.py (60 s cap)
#   make gpu-tests   GPU_TESTS (tests/gpu) in GPU_TEST_JOBS workers
#   (scripts/gpu_session.sh runs the three for a lent GPU, bounded, with the bench; docs/cuda.md)
#   make clean       remove build outputs
#
# Variables: PYTHON (python3), UCX_HOME (a UCX prefix to build against instead of the
# libucx-cu12 wheel, e.g. UCX_HOME=/usr for Debian's libucx-dev), MAX_JOBS (2: parallel
# compile jobs; gpu-check: every core), BUILD_EXT_FLAGS (extra flags for build_ext, e.g. --force), TEST_JOBS (2: pytest
# worker processes, each taking whole test files; 0 runs the suite in this process), CPP_PREBUILD
# (--cpp-prebuild: make test compiles the C++ test programs in the background; empty: not),
# PYTEST_ARGS,
# GPU_TEST_JOBS (4: gpu-check's pytest workers), GPU_TESTS (tests/gpu: the files gpu-tests runs,
# whole files per worker, handed out in this order), GPU_CXX, GPU_CC (g++, gcc: gpu-check's compilers).

PYTHON ?= python3
TORCH_REQ ?= torch==2.13.0
LIBUCX_VERSION ?= 1.22.0
MAX_JOBS ?= 2
# Two workers keep both cores busy: much of a multi-rank test is one rank waiting for another,
# or a timeout running out. Whole files go to one worker (loadfile), so a file's shared worlds
# and module fixtures run once; they are handed out in collection order, longest first
# (--no-loadscope-reorder; tests/conftest.py's FILE_SECONDS), so that no long file starts last.
TEST_JOBS ?= 2
BUILD_EXT_FLAGS ?=
PYTEST_ARGS ?=
# gpu-check compiles with every core unless MAX_JOBS is given (on the command line or in the
# environment): the GPU machines have cores to spare and little time.
ifeq ($(origin MAX_JOBS),file)
GPU_MAX_JOBS := $(shell nproc 2>/dev/null || echo 2)
else
GPU_MAX_JOBS := $(MAX_JOBS)
endif
GPU_TEST_JOBS ?= 4
GPU_TESTS ?= tests/gpu
# How gpu-tests spreads the files (scripts/gpu_session.sh drops what the machine's xdist lacks).
GPU_XDIST ?= -n $(GPU_TEST_JOBS) --dist loadfile --no-loadscope-reorder
# gpu-check compiles with GPU_CXX and GPU_CC, not the environment's CXX and CC: the GPU image sets CXX to a
# wrapper (/opt/gcc/bin/g++) that links libstdc++ statically, and an extension with its own
# libstdc++ next to torch's crashed every process at its first std::ostringstream.
GPU_CXX ?= g++
GPU_CC ?= gcc

# The in-place build is importable without installing anything.
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
export MAX_JOBS
ifdef UCX_HOME
export UCX_HOME
endif

# Targets depend on each other in order (deps before build before tests): never in parallel.
.NOTPARALLEL:
.PHONY: all deps build demo test test-quick lint gpu-check gpu-build gpu-smoke gpu-tests clean

all: build

# Install only what is missing, so that a warm machine does nothing. torch is installed only
# when absent (an existing torch is never replaced: the extension builds against it);
# libucx-cu12 is pinned. DEPS_MODULES lists what the build and the tests import, as
# module[:pip name] where the two differ (PyYAML is imported as yaml). Keep it in step with
# pyproject's "test" and "dev" extras (tests/test_deps.py checks both).
DEPS_MODULES := ninja numpy pytest xdist:pytest-xdist expecttest yaml:pyyaml mypy ruff

deps:
	@missing=""; \
	$(PYTHON) -c 'import torch' 2>/dev/null || missing="$$missing $(TORCH_REQ)"; \
	$(PYTHON) -c 'import importlib.metadata as m, sys; sys.exit(m.version("libucx-cu12") != "$(LIBUCX_VERSION)")' 2>/dev/null \
		|| missing="$$missing libucx-cu12==$(LIBUCX_VERSION)"; \
	for spec in $(DEPS_MODULES); do \
		mod=$${spec%%:*}; pkg=$${spec#*:}; \
		$(PYTHON) -c "import $$mod" 2>/dev/null || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing:$$missing"; \
		$(PYTHON) -m pip install $$missing; \
	else \
		echo "deps: all present"; \
	fi
	@# OpenSSL's headers for the udp backend's authenticated mode (secret_file): optional, the
	@# extension builds without them. Installed where apt-get can (as root), else named.
	@if ! echo '#include <openssl/evp.h>' | $${CXX:-c++} -x c++ -E - -o /dev/null 2>/dev/null; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			echo "deps: installing libssl-dev (udp authentication)"; \
			(apt-get update -qq && apt-get install -y -qq libssl-dev) \
				|| echo "deps: apt-get could not install libssl-dev: udp authentication will be off"; \
		else \
			echo "deps: <openssl/evp.h> not found: install libssl-dev (Debian/Ubuntu) or" \
				"openssl-devel (Fedora/RHEL) for udp authentication (secret_file)"; \
		fi; \
	fi

build:
	$(PYTHON) setup.py build_ext --inplace -j $(MAX_JOBS) $(BUILD_EXT_FLAGS)

demo: deps build
	PYTHON=$(PYTHON) OMP_NUM_THREADS=1 bash scripts/demo.sh

PYTEST := OMP_NUM_THREADS=1 $(PYTHON) -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder

# --cpp-prebuild: the C++ test programs compile at the lowest priority while the
# tests run, on the CPU the multi-rank tests leave idle (tests/cpp_prebuild.py). CPP_PREBUILD=
# (empty) leaves them to their tests, to compare the two (docs/testing.md).
CPP_PREBUILD ?= --cpp-prebuild
test: deps build
	$(PYTEST) $(CPP_PREBUILD) tests $(PYTEST_ARGS)

test-quick: deps build
	$(PYTEST) -m "not slow" tests $(PYTEST_ARGS)

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

# The CUDA checks, for a machine with a GPU and no package registry: nothing is installed. It
# needs torch with CUDA, UCX (the libucx-cu12/-cu13 wheel matching torch's CUDA, or UCX_HOME),
# pytest and pytest-xdist. It builds against the local torch with GPU_CXX, runs the link tests
# first (no CUDA library, libstdc++ shared: a bad build fails in seconds), prints `info` (UCX's
# CUDA transports, GPUDirect RDMA), runs scripts/gpu_smoke.py (two ranks stage by stage, capped
# at 60 s: a hang shows which stage), then tests/gpu (GPU_TEST_JOBS workers, whole files each).
gpu-check: gpu-build gpu-smoke gpu-tests

gpu-build:
	@$(PYTHON) -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' || { \
		echo "gpu-check: torch $$($(PYTHON) -c 'import torch; print(torch.__version__)') is built without CUDA"; exit 1; }
	@if [ -z "$(UCX_HOME)" ] && ! $(PYTHON) -c 'import libucx' 2>/dev/null; then \
		cu=$$($(PYTHON) -c 'import torch; print(torch.version.cuda.split(".")[0])'); \
		echo "gpu-check: no UCX: \`import libucx\` fails. torch is built for CUDA $$cu: install the"; \
		echo "  libucx-cu$$cu wheel (pip install libucx-cu$$cu, or its .whl file where there is no"; \
		echo "  registry), or set UCX_HOME to a UCX prefix built with CUDA support"; \
		exit 1; \
	fi
	@[ -n "$(UCX_HOME)" ] || $(PYTHON) -c 'import importlib.metadata as m, torch; \
		cu = torch.version.cuda.split(".")[0]; m.version(f"libucx-cu{cu}")' 2>/dev/null || \
		echo "gpu-check: warning: the libucx wheel installed is not libucx-cu$$($(PYTHON) -c \
		'import torch; print(torch.version.cuda.split(".")[0])') (torch's CUDA): UCX's CUDA transports may not load"
	@$(PYTHON) -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { \
		echo "gpu-check: torch.cuda.is_available() is False: no usable GPU here"; exit 1; }
	CC=$(GPU_CC) CXX=$(GPU_CXX) MAX_JOBS=$(GPU_MAX_JOBS) $(PYTHON) setup.py build_ext --inplace -j $(GPU_MAX_JOBS) $(BUILD_EXT_FLAGS)
	CXX=$(GPU_CXX) $(PYTHON) -m pytest -q tests/test_no_cuda_link.py
	$(PYTHON) -m ucxbackend info

gpu-smoke:
	timeout -k 5 60 $(PYTHON) scripts/gpu_smoke.py --timeout 55

# Files go to the workers in GPU_TESTS' order (--no-loadscope-reorder), so a session short of
# time lists what matters most first.
gpu-tests:
	OMP_NUM_THREADS=1 $(PYTHON) -m pytest -q $(GPU_XDIST) $(GPU_TESTS) $(PYTEST_ARGS)

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
	rm -f ucxbackend/_C*.so
	rm -rf tests/cpp/build
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
