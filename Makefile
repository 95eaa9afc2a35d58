# The two commands of the README, plus helpers.  Every target sets up what is
# missing first (scripts/bootstrap.sh is idempotent and fast when done).
SHELL := /bin/bash
# The venv: .venv in the checkout, or the one a lab machine's provisioning named (vagrant/provision.sh
# writes /etc/geo-testbed/venv, so the lab's venv stays inside the machine, out of the synced checkout).
VENV ?= $(or $(shell cat /etc/geo-testbed/venv 2>/dev/null),.venv)
# Scripts see the same venv: `sudo make VENV=/opt/venv test` works although sudo drops the environment.
export VENV
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bootstrap-stamp

.PHONY: demo demo-reduced test bootstrap lint clean unit vagrant-validate vagrant-docker-check

$(STAMP): pyproject.toml scripts/bootstrap.sh
	scripts/bootstrap.sh
	touch $(STAMP)

bootstrap: $(STAMP)

## The built-in demo: the default experiment end to end, figures and summary at the end.
demo: $(STAMP)
	$(PY) -m testbed.cli demo

## The demo in the reduced form CI runs (every scheme family, few steps).
demo-reduced: $(STAMP)
	$(PY) -m testbed.cli demo --reduced $(if $(DEMO_RESULTS),--results $(DEMO_RESULTS))

## The whole test suite; netem tests run natively where the kernel has netem, else in the kernel lab.
test: $(STAMP)
	scripts/run-tests.sh

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

lint: $(STAMP)
	$(VENV)/bin/ruff check .

vagrant-validate:
	cd vagrant && VAGRANT_CHECKPOINT_DISABLE=1 vagrant validate --ignore-provider

## `vagrant up --provider=docker`, the reduced demo inside, its records checked here, `vagrant destroy`.
vagrant-docker-check: $(STAMP)
	scripts/vagrant-docker-check.sh

clean:
	-$(PY) -m testbed.cli clean
