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
HOPPER_PRESET ?= hopper

ifeq ($(TORCH),auto)
  ifneq ($(shell command -v nvidia-smi 2>/dev/null),)
    TORCH := system
  else
    TORCH := cpu
  endif
endif

VPY   := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(TORCH)

.PHONY: help setup test lint sync unit notebooks book html slides slides-only executed executed-is-current stage browser-deps lab clean distclean vendor \
        hopper-check

help:
	@echo "make test    - lint, unit tests, every notebook (ci preset) under nbmake, the HTML book"
	@echo "               built from those executed notebooks, and the browser test of the site"
	@echo "make book    - execute the notebooks (preset auto-detected) and build book/_build/html"
	@echo "make slides  - one reveal.js deck per chapter in book/_build/slides (offline)"
	@echo "make sync    - copy the package's source into the chapters' code listings"
	@echo "make lab     - open JupyterLab on book/"
	@echo "make hopper-check - on one H100/H200: smoke test, benchmarks, ladder and notebooks in"
	@echo "               about 6 minutes, results in $$HOPPER_OUT (benchmarks/README.md)"
	@echo "make clean   - remove build outputs (keeps .venv; 'make distclean' removes it too)"
	@echo "TORCH=$(TORCH) (auto|cpu|system)"

$(STAMP): pyproject.toml scripts/fetch_te_source.py scripts/ensure_venv.py
	$(PYTHON) scripts/ensure_venv.py $(VENV) $(TORCH)  # recreated if made for the other TORCH
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
	$(VENV)/bin/ruff format --check tutorial_lib tests benchmarks scripts book/_ext book/chapters
	$(VPY) scripts/sync_sources.py --check book/chapters  # the package code the chapters show
	$(VENV)/bin/mypy  # settings and files: [tool.mypy] in pyproject.toml
	@$(VPY) scripts/line_count.py  # the package against the design's size budgets

# Build layout. The notebooks run once, under nbmake with --overwrite, in a copy of book/
# (scripts/stage_book.py); the HTML book and the slides are made from that executed copy.
# The copy is not under book/_build because nbmake refuses to collect paths containing "_build".
BUILD    := book/_build
STAGE    := book/_executed
EXECUTED := $(STAGE)/.executed
CHROMIUM ?= /usr/bin/chromium

# One math thread per pytest worker: JOBS workers share the cores, and oversubscription made
# notebook training ~10x slower on 2 cores. No MPLBACKEND here: the notebooks' kernels must keep
# their inline backend, or the executed notebooks would have no figures.
NB_ENV   := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
TEST_ENV := TUTORIAL_PRESET=$(PRESET_CI) $(NB_ENV)
NBMAKE   := --nbmake --overwrite
# make test (ci preset): each notebook has a 90 s budget on a 2-core CPU (benchmarks/
# notebook_times.py records the times, and warns past it). A notebook that regresses to minutes
# fails with its name: 120 s per cell (nbmake), 180 s per notebook, 240 s per unit test.
NOTEBOOK_BUDGET_S ?= 90
TEST_LIMITS := --nbmake-timeout=120 --timeout=180
REPORT   := $(BUILD)/test-report.xml

stage: $(STAMP) vendor
	$(VPY) scripts/stage_book.py book $(STAGE)
	$(VPY) scripts/sync_sources.py $(STAGE)/chapters  # the book shows the package as built

# Copy the package's current source into the chapters' source cells (scripts/sync_sources.py).
sync: $(STAMP)
	$(VPY) scripts/sync_sources.py book/chapters

# make test: 1. the unit tests, then every notebook (ci preset), two at a time: apart, because
# the multi-process TP tests next to a notebook doubled its time; both run even if the first
# fails; 2. the HTML book and the slides from those executed notebooks; 3. the browser test.
test: $(STAMP) lint vendor browser-deps stage
	@rm -f $(EXECUTED)
	@status=0; set -x; \
	$(TEST_ENV) $(VENV)/bin/pytest -n $(JOBS) --dist worksteal --timeout=240 --ignore=tests/browser tests \
	  || status=1; \
	$(TEST_ENV) $(VENV)/bin/pytest -n $(JOBS) --dist worksteal $(NBMAKE) $(TEST_LIMITS) --junitxml=$(REPORT) \
	  $(STAGE)/chapters || status=1; \
	exit $$status
	@touch $(EXECUTED)
	$(VPY) benchmarks/notebook_times.py --junit $(REPORT) --out $(BUILD)/notebook_times \
	  --budget-s $(NOTEBOOK_BUDGET_S)
	$(MAKE) --no-print-directory html slides-only
	$(TEST_ENV) CHROMIUM=$(CHROMIUM) $(VENV)/bin/pytest -p no:cacheprovider tests/browser

unit: $(STAMP)
	$(TEST_ENV) $(VENV)/bin/pytest -n $(JOBS) --dist worksteal --timeout=240 --ignore=tests/browser tests

# Only the notebooks, executed in place of the staged copy (the preset is auto-detected:
# `hopper` on an sm_90 GPU, `ci` elsewhere; set TUTORIAL_PRESET to choose). On a GPU machine
# one notebook runs at a time: two sharing the GPU would publish contended timings.
NB_JOBS := $(if $(filter system,$(TORCH)),1,$(JOBS))

executed: $(STAMP) stage
	@rm -f $(EXECUTED)
	$(NB_ENV) $(VENV)/bin/pytest -n $(NB_JOBS) -p no:cacheprovider $(NBMAKE) --nbmake-timeout=900 \
	  $(STAGE)/chapters
	@touch $(EXECUTED)

notebooks: executed

book: $(STAMP) vendor executed
	$(MAKE) --no-print-directory html
	@echo "Open $(BUILD)/html/index.html"

# The HTML from the executed copy; execution is off there. -W: every warning fails the build,
# -n: so does every broken internal reference.
html: $(STAMP) vendor executed-is-current
	rm -rf $(BUILD)/html
	$(VENV)/bin/jupyter-book build --all -W -n --keep-going $(STAGE) --path-output book

slides: $(STAMP) vendor
	@$(MAKE) --no-print-directory -s executed-is-current 2>/dev/null || $(MAKE) --no-print-directory executed
	$(MAKE) --no-print-directory slides-only

slides-only: executed-is-current
	$(VPY) scripts/slides.py build $(STAGE)/chapters $(BUILD)/slides --vendor book/_vendor

# The executed copy must exist and be newer than every source of the book, or the HTML and the
# slides would silently show an older version. The slide outlines and template (book/_slides) are
# read by scripts/slides.py, not by the notebooks: editing them needs no new execution.
executed-is-current:
	@test -f $(EXECUTED) || (echo "no executed notebooks in $(STAGE): run 'make book' (or 'make executed')"; exit 1)
	@stale=$$(find book \( -path book/_build -o -path $(STAGE) -o -path book/_vendor \
	  -o -path book/_slides -o -name __pycache__ -o -name .ipynb_checkpoints \) -prune -o -type f -newer $(EXECUTED) -print | head -3); \
	  test -z "$$stale" || (echo "book sources changed since the notebooks were executed ($$stale): run 'make book'"; exit 1)

vendor: $(STAMP)
	$(VPY) scripts/vendor_js.py book/_vendor

# Headless Chromium for tests/browser, from Debian's package (Playwright drives it; it downloads
# no browser of its own).
browser-deps:
	@test -x $(CHROMIUM) || { \
	  echo "installing Debian's chromium for the browser test"; \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  APT="$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get"; \
	  $$APT install -y --no-install-recommends chromium \
	    || { $$APT update && $$APT install -y --no-install-recommends chromium; }; }
	@test -x $(CHROMIUM) || (echo "no $(CHROMIUM): install Debian's chromium package, or set CHROMIUM=/path/to/chromium"; exit 1)

# The device check on one H100/H200 (benchmarks/README.md): runs with $(PYTHON)'s CUDA torch as
# it is (no .venv), about 6 minutes; report.md, smoke.json and results.tar.gz in $(HOPPER_OUT).
HOPPER_OUT ?= hopper_check_out
hopper-check:
	$(PYTHON) scripts/hopper_check.py --preset $(HOPPER_PRESET) --out $(HOPPER_OUT)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab book

clean:
	rm -rf book/_build book/_executed .pytest_cache .ruff_cache runs
	find . -name __pycache__ -not -path "./$(VENV)/*" -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) book/_vendor .cache
