# The two commands a fresh clone needs (each sets itself up; re-runs are cheap):
#   make up     -> weaver up on the embedded default (testbed + mini-RIC + xApp + agents + dashboard)
#   make test   -> scripts/test: provision (system packages, Redis), venvs, ruff, the whole suite in both venvs
.PHONY: up test venvs lint provision
ARGS ?=

venvs:
	@scripts/bootstrap all

provision:
	@scripts/provision

up: venvs
	.venv-xapp/bin/weaver up $(ARGS)

lint: venvs
	.venv-xapp/bin/ruff check .

test:
	scripts/test $(ARGS)
