# The two commands a newcomer needs: `make book` and `make test`. Both set up .venv on first use.
#
# Which torch?  TORCH=auto (default) picks:
#   - cpu:    no NVIDIA GPU found -> install the CPU wheel $(TORCH_CPU_SPEC) into .venv;
#   - system: nvidia-smi found    -> create .venv with --system-site-packages and reuse the CUDA
#             torch already installed for $(PYTHON) (install one first, e.g. via environment.yml).
# Override with `make test TORCH=cpu` or `make test TORCH=system`.

PYTHON     ?= python3
VENV       ?= .venv
TORCH      ?= auto
TORCH_CPU_SPEC ?= torch==2.13.0
PRESET_CI  ?= ci
JOBS       ?= 2

ifeq ($(TORCH),auto)
  ifneq ($(shell command -v nvidia-smi 2>/dev/null),)
    TORCH := system
  else
    TORCH := cpu
  endif
endif

VPY   := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(TORCH)
VENV_FLAGS := $(if $(filter system,$(TORCH)),--system-site-packages,)

.PHONY: help setup test lint unit notebooks book lab clean vendor

help:
	@echo "make test   - lint, unit tests and every notebook (ci preset) under nbmake"
	@echo "make book   - execute the notebooks and build the HTML book in book/_build/html"
	@echo "make lab    - open JupyterLab on book/"
	@echo "make clean  - remove build outputs (keeps .venv; 'make distclean' removes it too)"
	@echo "TORCH=$(TORCH) (auto|cpu|system)"

$(STAMP): pyproject.toml scripts/fetch_te_source.py
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
ifeq ($(TORCH),cpu)
	$(VPY) -m pip install --quiet "$(TORCH_CPU_SPEC)"
else
	@$(VPY) -c "import torch; print('using system torch', torch.__version__, 'cuda', torch.version.cuda)" \
	  || (echo "TORCH=system but no torch importable from $(PYTHON); install a CUDA torch first (environment.yml)"; exit 1)
endif
	$(VPY) -m pip install --quiet -e ".[dev,book]"
	$(VPY) scripts/fetch_te_source.py  # TE's pure-Python source, for the API contract test
	@rm -f $(VENV)/.installed-*
	@touch $@

setup: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check tutorial_lib tests benchmarks scripts book
	$(VENV)/bin/ruff format --check tutorial_lib tests benchmarks scripts

# One pytest run for unit tests and notebooks, so the closing "N passed" line counts both.
# JOBS workers share the cores: one math thread each avoids oversubscription (which made
# notebook training ~10x slower on 2 cores).
TEST_ENV := TUTORIAL_PRESET=$(PRESET_CI) MPLBACKEND=Agg OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

test: $(STAMP) lint
	$(TEST_ENV) $(VENV)/bin/pytest -n $(JOBS) --nbmake --nbmake-timeout=600 tests book/chapters

unit: $(STAMP)
	$(TEST_ENV) $(VENV)/bin/pytest -n $(JOBS) tests

notebooks: $(STAMP)
	$(TEST_ENV) $(VENV)/bin/pytest -n $(JOBS) --nbmake --nbmake-timeout=600 book/chapters

vendor: $(STAMP)
	$(VPY) scripts/vendor_js.py book/_vendor

book: $(STAMP) vendor
	$(VENV)/bin/jupyter-book build --all -W -n --keep-going book
	@echo "Open book/_build/html/index.html"

lab: $(STAMP)
	$(VENV)/bin/jupyter lab book

clean:
	rm -rf book/_build .pytest_cache .ruff_cache runs
	find . -name __pycache__ -not -path "./$(VENV)/*" -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) book/_vendor .cache
