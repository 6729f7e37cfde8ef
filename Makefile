# Two commands do everything from a fresh clone (see README.md):
#   make book   execute every notebook, build the book, print where it is
#   make test   library tests, then the same build, then checks on the rendered site
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BUILD_DIR ?= _build
SITE := $(BUILD_DIR)/site
HTML := $(BUILD_DIR)/_build/html
export ATTNOPT_BUILD_DIR := $(BUILD_DIR)
JB_FLAGS := --all -W -n --keep-going

.PHONY: book test lab lab-test install notebooks html student-book pdf assignments clean

# The environment is (re)installed when it is missing or the pins change.
$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

install: $(STAMP)

# papermill runs each notebook in a fresh kernel into $(SITE)/notebooks (cached locally, never on CI).
notebooks: $(STAMP)
	$(BIN)/python tools/run_notebooks.py

# Jupyter Book renders the executed copies; it never executes anything itself.
html: notebooks
	rm -rf $(HTML)
	cd $(SITE) && $(abspath $(BIN))/jupyter-book build . --path-output .. $(JB_FLAGS)

# The same book with all exercise solutions removed.
STUDENT_HTML := $(BUILD_DIR)/student/_build/html
student-book: notebooks
	$(BIN)/python tools/edition.py student $(SITE)
	rm -rf $(STUDENT_HTML)
	cd $(SITE) && $(abspath $(BIN))/jupyter-book build . --config _config.student.yml --path-output ../student $(JB_FLAGS)
	@echo "The student edition is at $(abspath $(STUDENT_HTML))/index.html"

# One offline PDF of the whole book, printed by headless Chromium from the HTML build.
pdf: html
	$(BIN)/python tools/pdf.py $(BUILD_DIR) $(BUILD_DIR)/book.pdf
	@echo "The PDF is at $(abspath $(BUILD_DIR))/book.pdf"

# nbgrader's student versions of the assignments: assignments/ is copied to $(BUILD_DIR)/assignments
# (a course directory; its gradebook and submissions are kept) and `nbgrader generate_assignment`
# writes the release versions there (see tools/assignments.py and the instructor's guide).
assignments: $(STAMP)
	$(BIN)/python tools/assignments.py $(BUILD_DIR)/assignments

book: html
	@echo ""
	@echo "The book is at $(abspath $(HTML))/index.html"

# Each stage says how long it took, in wall time and in the machine's busy CPU (tools/stage.sh).
STAGE := bash tools/stage.sh

test: $(STAMP)
	# tests/peers: entmax's and POT's own tests run against attnopt; tests/package: the wheel and
	# sdist built offline, installed outside the checkout with the core only. One pytest-xdist
	# process per core, each taking whole modules (their module-scoped fixtures are built once)
	$(STAGE) library $(BIN)/python -m pytest -n auto --dist loadfile tests/lib tests/peers tests/conventions tests/assignments tests/package
	# the GPU parity tests skip without CUDA: run them CPU-against-CPU so that their code stays current
	ATTNOPT_PARITY_DEVICE=cpu $(STAGE) parity $(BIN)/python -m pytest -q tests/lib/test_device_parity.py
	$(STAGE) doctests $(BIN)/python -m pytest --doctest-modules src/attnopt
	# Two jobs at a time (-j2): the notebooks (run_notebooks.py prints each one's time) beside
	# JupyterLab's browser test, which mostly waits for its server and browser (0.4 of a core for
	# 90 s alone; beside the xdist suites above its slider test timed out twice, so it waits for
	# them); then the HTML and the student edition, two Sphinx builds of the same staged sources on
	# one core each; then the PDF from the HTML
	$(STAGE) notebooks-lab-builds $(MAKE) -j2 lab-test pdf student-book
	# the browser checks in two xdist processes too (one page at a time kept a core and a half busy);
	# each pass over every page stays in one process (tests/book/conftest.py: SHARED_PASSES)
	$(STAGE) site $(BIN)/python -m pytest -n auto tests/book

# JupyterLab in a browser: an explorer notebook runs and its widgets answer a slider (tests/lab)
lab-test: $(STAMP)
	$(BIN)/python -m pytest tests/lab

# JupyterLab on the notebooks, the explorers' widgets working (tests/lab runs one in a browser);
# --allow-root only when run as root (a container)
lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf _build
