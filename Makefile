# The two commands of the README: `make demo` and `make test` do their own set-up.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export GLOG_minloglevel := 2

.PHONY: demo test test-dev test-mindspore lint venvs test-min bench bench-mindspore bench-peers clean

# The editable installs write unihook.egg-info here: one at a time where the venvs are built
# side by side (`make -j2 venvs`), under a lock on pyproject.toml (flock leaves no file)
EDITABLE := flock pyproject.toml

$(STAMP): pyproject.toml requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(EDITABLE) $(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# MindSpore runs in a venv of its own (requirements-mindspore.txt: it needs numpy 1.x), with
# torch and paddle: the shipped conformance suite on MindSpore, the differential tests of the
# three frameworks (every hook kind through the kits; the module backward hooks against torch's
# native ones; forward hooks on a small CNN), the demo's three columns. `make test` runs it
# beside the dev suite.
MS_VENV := .venv-mindspore
MS_PY := $(MS_VENV)/bin/python
MS_STAMP := $(MS_VENV)/.installed

$(MS_STAMP): pyproject.toml requirements-mindspore.txt
	test -x $(MS_PY) || $(PYTHON) -m venv $(MS_VENV) || python3 -m venv $(MS_VENV)
	$(MS_PY) -m pip install --quiet --upgrade pip
	$(MS_PY) -m pip install --quiet -r requirements-mindspore.txt
	$(EDITABLE) $(MS_PY) -m pip install --quiet --no-deps -e .
	touch $(MS_STAMP)

# Both venvs (`make -j2 venvs` builds them side by side: CI does)
venvs: $(STAMP) $(MS_STAMP)

# The demo in the venv that has the three frameworks (above)
demo: $(MS_STAMP)
	$(MS_PY) -m unihook demo --out demo-out

# The dev suite and the MindSpore step side by side (one process each, on two cores): `make
# test` takes the longer of the two; each one's output is printed whole when it ends
test:
	$(MAKE) -j2 --output-sync=target test-dev test-mindspore

# These attackers' files run in the MindSpore step (its venv has the same torch and paddle):
# the two halves then take about as long (19:22 and 22:20 with h56 here, 2026-12-01; 16:56 and
# 15:04 before h96 and h98 moved, about a minute, 2026-12-02; 19:11 and 18:00 on 343923e, then
# h59 moved, about a minute, 2026-12-03; 19:53 and 17:10 on ad62771, then h56 and h60 moved,
# 76 s, 2026-12-08)
ATTACKS := tests/test_attack_h56.py tests/test_attack_h57.py tests/test_attack_h58.py \
	tests/test_attack_h59.py tests/test_attack_h60.py \
	tests/test_attack_h61.py tests/test_attack_h64.py tests/test_attack_h67.py tests/test_attack_h68.py \
	tests/test_attack_h71.py tests/test_attack_h72.py tests/test_attack_h73.py tests/test_attack_h91.py \
	tests/test_attack_h96.py tests/test_attack_h98.py tests/test_attack_h102.py \
	tests/test_attack_h108.py

# the slowest tests each step lists (`make test DURATIONS=150` to see where the time goes)
DURATIONS ?= 15

test-dev: $(STAMP)
	$(PY) -m pytest -q --durations=$(DURATIONS) $(ATTACKS:%=--ignore=%)

# the wheel in a fresh venv with MindSpore only (its packages are this venv's), and the README's
# quickstart beside the three frameworks
MS_PACKAGE := $(foreach t,quickstart_from_the_wheel_with_one_framework[mindspore] \
	cli_from_the_wheel_with_one_framework[mindspore] the_whole_quickstart_runs_beside_every_framework,\
	'tests/test_package.py::test_$(t)')

test-mindspore: $(MS_STAMP)
	UNIHOOK_CONFORMANCE_BACKEND=mindspore $(MS_PY) -m pytest -q --durations=$(DURATIONS) unihook/conformance \
		tests/test_differential_kits.py tests/test_differential_backward.py \
		tests/test_differential_forward.py tests/test_mindspore_native.py tests/test_demo.py \
		tests/test_bench_smoke_mindspore.py tests/test_kept_inputs_mindspore.py \
		tests/test_attack_h82.py tests/test_flag_tables.py tests/test_lazy_dicts_mindspore.py \
		tests/test_hook_dict_races.py \
		tests/test_attack_h83.py tests/test_attack_h84.py tests/test_attack_h86.py $(ATTACKS) \
		tests/test_mindspore_none_grads.py tests/test_mindspore_skipped_inputs.py \
		tests/test_mindspore_view_inputs.py tests/test_parked_hook_dicts.py \
		$(MS_PACKAGE)

# ruff, and pyright in standard mode on unihook/ and backends/ ([tool.pyright] in pyproject.toml),
# the MindSpore backend against the MindSpore venv's packages (pyright-mindspore.json)
lint: $(STAMP) $(MS_STAMP)
	$(VENV)/bin/ruff check unihook backends tests benchmarks
	$(VENV)/bin/ruff format --check unihook backends tests benchmarks
	$(VENV)/bin/pyright
	$(VENV)/bin/pyright -p pyright-mindspore.json
	PYTHONPATH=. $(VENV)/bin/pyright --verifytypes unihook --ignoreexternal > /dev/null \
		|| { echo "pyright --verifytypes unihook: the public API is not fully typed"; exit 1; }

# The suite on the lowest versions pyproject.toml declares (README "Supported versions"), in a
# throwaway venv. Not in CI: torch from PyPI is a CUDA build (~3 GB with its libraries);
# `make test-min TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes the CPU build.
# pytest 8.0 is the last one that runs with pluggy 1.3. tests/test_package.py checks that
# these pins are pyproject.toml's lower bounds.
MIN_VENV ?= /tmp/unihook-venv-min
MIN_PINS := torch==2.13.0 paddlepaddle==3.3.0 numpy==1.24.4 pluggy==1.3.0
MIN_TOOLS := pytest==8.0.2 hypothesis==6.170.15 "matplotlib<3.10" build==1.6.1 setuptools==84.2.1

test-min:
	rm -rf $(MIN_VENV)
	$(PYTHON) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/pip install --quiet $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),) \
		$(MIN_PINS) $(MIN_TOOLS)
	$(MIN_VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	$(MIN_VENV)/bin/python -c "import torch, paddle; print(torch.__version__, paddle.__version__)"
	$(MIN_VENV)/bin/python -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/run.py $(if $(QUICK),--quick,)

# The same cases with MindSpore's rows: torch, paddle and MindSpore side by side in one process,
# in the MindSpore venv (above; it writes the same results/latest.json)
bench-mindspore: $(MS_STAMP)
	$(MS_PY) benchmarks/run.py $(if $(QUICK),--quick,)

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
	rm -rf $(VENV) $(MS_VENV) demo-out
