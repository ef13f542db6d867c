# ucxbackend: build, demo, tests.
#
#   make demo        deps + build + 2-rank DDP demo on ucx and gloo, compared
#   make test        deps + build + the whole test suite
#   make test-quick  deps + build + tests not marked slow
#   make build       (re)build ucxbackend/_C in place; ninja recompiles only what changed
#   make lint        ruff, and mypy strict over ucxbackend/
#   make clean       remove build outputs
#
# Variables: PYTHON (python3), UCX_HOME (a UCX prefix to build against instead of the
# libucx-cu12 wheel, e.g. UCX_HOME=/usr for Debian's libucx-dev), MAX_JOBS (2: parallel
# compile jobs), BUILD_EXT_FLAGS (extra flags for build_ext, e.g. --force), TEST_JOBS (2: pytest
# worker processes, each taking whole test files; 0 runs the suite in this process), PYTEST_ARGS.

PYTHON ?= python3
TORCH_REQ ?= torch==2.13.0
LIBUCX_VERSION ?= 1.22.0
MAX_JOBS ?= 2
# Two workers keep both cores busy: much of a multi-rank test is one rank waiting for another,
# or a timeout running out. Whole files go to one worker (loadfile), so a file's shared worlds
# and module fixtures run once.
TEST_JOBS ?= 2
BUILD_EXT_FLAGS ?=
PYTEST_ARGS ?=

# The in-place build is importable without installing anything.
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
export MAX_JOBS
ifdef UCX_HOME
export UCX_HOME
endif

# Targets depend on each other in order (deps before build before tests): never in parallel.
.NOTPARALLEL:
.PHONY: all deps build demo test test-quick lint clean

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

build:
	$(PYTHON) setup.py build_ext --inplace -j $(MAX_JOBS) $(BUILD_EXT_FLAGS)

demo: deps build
	PYTHON=$(PYTHON) OMP_NUM_THREADS=1 bash scripts/demo.sh

PYTEST := OMP_NUM_THREADS=1 $(PYTHON) -m pytest -q -n $(TEST_JOBS) --dist loadfile

test: deps build
	$(PYTEST) tests $(PYTEST_ARGS)

test-quick: deps build
	$(PYTEST) -m "not slow" tests $(PYTEST_ARGS)

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
	rm -f ucxbackend/_C*.so
	rm -rf tests/cpp/build
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
