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

# Peers (nnsight, transformer-lens) live in their own venv so they never touch .venv's pins.
# torch==2.13.0 is on the same pip command line as the peers so pip cannot upgrade it.
PEERS_VENV := .venv-peers
PEERS_PY := $(PEERS_VENV)/bin/python
PEERS_STAMP := $(PEERS_VENV)/.installed

$(PEERS_STAMP): pyproject.toml benchmarks/requirements-peers.txt
	test -x $(PEERS_PY) || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_PY) -m pip install --quiet --upgrade pip
	$(PEERS_PY) -m pip install --quiet torch==2.13.0 paddlepaddle==3.3.1 numpy -e . \
		-r benchmarks/requirements-peers.txt
	touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)
	$(PEERS_PY) benchmarks/run.py $(if $(QUICK),--quick,)

clean:
	rm -rf $(VENV) demo-out
