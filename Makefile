# hvdcompress: `make demo` and `make test` set up everything that is missing, then run.
VENV ?= .venv
PY := $(VENV)/bin/python
HOROVODRUN := $(VENV)/bin/horovodrun
SETUP_STAMP := $(VENV)/.hvdc-setup-main.project
KERAS3_VENV ?= .venv-keras3
KERAS3_STAMP := $(KERAS3_VENV)/.hvdc-setup-keras3.project

.PHONY: setup demo test test-unit test-keras3 bench-kernels docs docs-tools wheel-smoke clean

$(SETUP_STAMP): setup.py pyproject.toml scripts/setup_env.sh $(wildcard hvdcompress/ops/*.cpp hvdcompress/ops/*.h)
	bash scripts/setup_env.sh $(VENV) main

setup: $(SETUP_STAMP)

# The docs tools: the `docs` extra's pinned versions (read from pyproject.toml) in .venv, and a
# headless Chromium for tests/test_docs.py (Debian's package, installed when missing: needs root).
DOCS_STAMP := $(VENV)/.hvdc-setup-docs
$(DOCS_STAMP): pyproject.toml $(SETUP_STAMP)
	$(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))' > $(VENV)/docs-requirements.txt
	$(PY) -m pip install -q -r $(VENV)/docs-requirements.txt
	command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; } \
	  || { echo "[setup] FAILED at step 'chromium': install Debian's chromium (apt-get install -y chromium, as root)" >&2; exit 1; }
	touch $@

docs-tools: $(DOCS_STAMP)

# The docs site into site/ (site/index.html), warnings as errors.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

# The wheel of this checkout, built in a clean venv and imported from it (no framework).
wheel-smoke:
	bash scripts/wheel_smoke.sh

demo: setup
	PATH=$(VENV)/bin:$$PATH $(PY) examples/demo.py

# Two workers, one test file each at a time (--dist loadfile: a file's launches and module
# fixtures stay on one worker): the launches wait on their ranks much of the time.
test: setup $(DOCS_STAMP)
	PATH=$(VENV)/bin:$$PATH $(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=15 tests

test-unit: setup
	PATH=$(VENV)/bin:$$PATH $(PY) -m pytest -q -p no:cacheprovider tests -m "not horovod"

# The TF tests on TensorFlow 2.18 / Keras 3 (no torch: the cross-framework comparison skips).
# TF runs the C++ kernel library, so the stamp depends on its sources too.
# The first run builds Horovod against TF 2.18 (about 10 minutes, 2 compile jobs; cached).
$(KERAS3_STAMP): setup.py pyproject.toml scripts/setup_env.sh $(wildcard hvdcompress/ops/*.cpp hvdcompress/ops/*.h)
	bash scripts/setup_env.sh $(KERAS3_VENV) keras3

test-keras3: $(KERAS3_STAMP)
	PATH=$(KERAS3_VENV)/bin:$$PATH $(KERAS3_VENV)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests/test_tf_*.py

bench-kernels: setup
	PATH=$(VENV)/bin:$$PATH $(PY) benchmarks/kernels.py

clean:
	rm -rf build *.egg-info site
