# The two commands of the README. Both create .venv themselves (scripts/setup.sh).
VENV ?= .venv
PYTEST_ARGS ?=

.PHONY: demo test setup setup-dev serve bench clean migration

demo: setup
	$(VENV)/bin/tunedeck demo

test: setup-dev
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

setup:
	scripts/setup.sh

setup-dev:
	scripts/setup.sh dev

serve: setup
	$(VENV)/bin/tunedeck serve

migration: setup-dev
	PYTHONPATH=backend $(VENV)/bin/python scripts/new_migration.py "$(MSG)"

clean:
	rm -rf $(VENV) tunedeck-workspace test-output
