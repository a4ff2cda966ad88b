# The two commands a fresh clone needs (each sets itself up; re-runs are cheap):
#   make up     -> weaver up on the embedded default (testbed + mini-RIC + xApp + agents + dashboard)
#   make test   -> ruff + the whole test suite in both venvs
.PHONY: up test venvs lint
ARGS ?=

venvs:
	@scripts/bootstrap all

up: venvs
	.venv-xapp/bin/weaver up $(ARGS)

lint: venvs
	.venv-xapp/bin/ruff check .

test: venvs
	scripts/test $(ARGS)
