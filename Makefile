# One-command set-up on a fresh machine: `make test` and `make demo` install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# Debian packages the tests need (installed with apt-get when missing).
DEB_PACKAGES := prometheus
DEB_BINARIES := prometheus

.PHONY: install test demo lint clean native

install: $(STAMP)

$(STAMP): pyproject.toml setup.py csrc/page_allocator.cpp csrc/paged_kernels.cpp Makefile
	@missing=""; for b in $(DEB_BINARIES); do command -v $$b >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $(DEB_PACKAGES); \
	fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# the CPU build on local disk; a bare `torch` would pull a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q setuptools wheel pybind11
	$(PIP) install -q --no-build-isolation -e '.[dev]'
	$(MAKE) native
	touch $(STAMP)

# builds the pybind11 page allocator and CPU paged kernels in place (engine/_page_allocator*.so,
# engine/_paged_kernels*.so)
native:
	$(PY) setup.py -q build_ext --inplace
	$(PY) -c "import engine; assert engine.native_available(), 'native page allocator did not build'; print('native page allocator: ok')"
	$(PY) -c "from engine.attention.cpu_backend import kernels_available as ok; print('CPU paged kernels:', 'ok' if ok() else 'not built, torch backend used')"

lint: install
	$(VENV)/bin/ruff check .

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

demo: install
	$(VENV)/bin/slopilot demo --live

clean:
	rm -rf $(VENV) build *.egg-info engine/_page_allocator*.so
