# The two commands of the README: `make demo` and `make test` do their own set-up.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export GLOG_minloglevel := 2

.PHONY: demo test bench bench-peers clean

$(STAMP): pyproject.toml requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m unihook demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/run.py $(if $(QUICK),--quick,)

clean:
	rm -rf $(VENV) demo-out
