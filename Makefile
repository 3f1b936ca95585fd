# The two commands of the README. Both create .venv themselves (scripts/setup.sh).
VENV ?= .venv
PYTEST_ARGS ?=
# ruff's tree; mypy's packages are pyproject's [tool.mypy] `files`.
LINT_PATHS = backend trainer tests bench scripts

.PHONY: demo test lint setup setup-dev serve bench clean migration

demo: setup
	$(VENV)/bin/tunedeck demo

test: setup-dev
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# What the suite's lint step runs (tests/test_project.py), on its own: the same as pre-commit.
lint: setup-dev
	$(VENV)/bin/python -m ruff check $(LINT_PATHS)
	$(VENV)/bin/python -m ruff format --check $(LINT_PATHS)
	$(VENV)/bin/python -m mypy

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
