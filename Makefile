# The two commands of the README, plus helpers.  Every target sets up what is
# missing first (scripts/bootstrap.sh is idempotent and fast when done).
SHELL := /bin/bash
VENV ?= .venv
# Scripts see the same venv: `sudo make VENV=/opt/venv test` works although sudo drops the environment.
export VENV
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bootstrap-stamp

.PHONY: demo test bootstrap lint clean unit vagrant-validate

$(STAMP): pyproject.toml scripts/bootstrap.sh
	scripts/bootstrap.sh
	touch $(STAMP)

bootstrap: $(STAMP)

## The built-in demo: the default experiment end to end, figures and summary at the end.
demo: $(STAMP)
	$(PY) -m testbed.cli demo

## The whole test suite; netem tests run natively where the kernel has netem, else in the kernel lab.
test: $(STAMP)
	scripts/run-tests.sh

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

lint: $(STAMP)
	$(VENV)/bin/ruff check .

vagrant-validate:
	cd vagrant && VAGRANT_CHECKPOINT_DISABLE=1 vagrant validate --ignore-provider

clean:
	-$(PY) -m testbed.cli clean
