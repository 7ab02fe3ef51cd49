# hvdcompress: `make demo` and `make test` set up everything that is missing, then run.
VENV ?= .venv
PY := $(VENV)/bin/python
HOROVODRUN := $(VENV)/bin/horovodrun
SETUP_STAMP := $(VENV)/.hvdc-setup-main.project

.PHONY: setup demo test test-unit test-keras3 bench-kernels clean

$(SETUP_STAMP): setup.py pyproject.toml scripts/setup_env.sh
	bash scripts/setup_env.sh $(VENV) main

setup: $(SETUP_STAMP)

demo: setup
	PATH=$(VENV)/bin:$$PATH $(PY) examples/demo.py

test: setup
	PATH=$(VENV)/bin:$$PATH $(PY) -m pytest -q -p no:cacheprovider tests

test-unit: setup
	PATH=$(VENV)/bin:$$PATH $(PY) -m pytest -q -p no:cacheprovider tests -m "not horovod"

bench-kernels: setup
	PATH=$(VENV)/bin:$$PATH $(PY) benchmarks/kernels.py

clean:
	rm -rf build *.egg-info
