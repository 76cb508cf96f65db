# The one command surface: CI calls these same targets.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed-stamp
PIP_COMPILE_FLAGS := --quiet --strip-extras --no-emit-index-url --no-emit-trusted-host \
	--no-emit-find-links --no-emit-options --allow-unsafe

.PHONY: help setup tools run test test-unit test-integration test-e2e test-faults lint fmt typecheck \
	proto proto-check migrations-check bench bench-http bench-grpc bench-report bench-floor bench-scale bench-memory services-up requirements clean compose-token

help:
	@echo "make run     start the embedded stack (SQLite, in-process executor) with the demo"
	@echo "make test    lint, type check, proto and migration checks, then every test"
	@echo "make test-faults  fault injection on real processes (AGENT_REACH_FAULTS_PROFILE=long)"
	@echo "make bench   throughput and latency on Postgres (prints machine and commit)"
	@echo "make bench-http  the http connector's calls/s to a local downstream"
	@echo "make bench-grpc  grpc.aio's server CPU per unary call and per stream message"
	@echo "make bench-report  the report path alone: controller and Postgres CPU per result"
	@echo "make bench-floor  our controller's CPU per task beside a skeleton's on the same stack"
	@echo "make bench-scale  cost per step with 10k, 100k and 1M steps queued"
	@echo "make bench-memory  memory search's precision@k and recall@k on a labelled set"
	@echo "make tools   install promtool and Chromium (Debian packages) if missing"

setup: $(STAMP)

# Pins come from requirements/dev.txt; the project itself is installed editable without deps.
$(STAMP): pyproject.toml controller/client/pyproject.toml requirements/dev.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/dev.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e controller/client
	touch $@

# promtool (Debian's `prometheus` package) checks deploy/prometheus/ and a real /metrics scrape in
# the tests; Chromium (Debian's `chromium`) runs the console's browser tests, driven by Playwright
# (whose own browser download is never used). Each is installed only when missing.
tools:
	@missing=""; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	test -x /usr/bin/chromium || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
		sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$sudo apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends \
			$$missing >/dev/null; \
	fi
	@promtool --version | head -n1
	@/usr/bin/chromium --version

# Re-pin after changing dependency ranges in pyproject.toml.
requirements: $(VENV)
	$(BIN)/pip-compile $(PIP_COMPILE_FLAGS) -o requirements/runtime.txt pyproject.toml
	$(BIN)/pip-compile $(PIP_COMPILE_FLAGS) --extra dev -o requirements/dev.txt pyproject.toml
	$(BIN)/pip-compile $(PIP_COMPILE_FLAGS) -o requirements/embed.txt requirements/embed.in

run: setup
	$(BIN)/reach dev --demo

test: setup lint proto-check migrations-check
	$(BIN)/pytest -q -p no:cacheprovider --ignore=tests/faults

# Kills, pauses, Postgres crashes, ambiguous commits, downstream faults and overload against real
# processes and a private Postgres; prints one figure per scenario (see tests/faults/conftest.py).
test-faults: setup
	$(BIN)/pytest -q -p no:cacheprovider tests/faults

test-unit: setup
	$(BIN)/pytest -q tests/unit

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

fmt: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

proto: setup
	$(PY) -m grpc_tools.protoc -Iproto --python_out=proto --pyi_out=proto \
		--grpc_python_out=proto proto/agent_reach/v1/executor.proto

# Regenerates the stubs in a scratch folder and fails if the committed ones differ.
proto-check: setup
	@tmp=$$(mktemp -d) && \
	$(PY) -m grpc_tools.protoc -Iproto --python_out=$$tmp --pyi_out=$$tmp \
		--grpc_python_out=$$tmp proto/agent_reach/v1/executor.proto && \
	for f in executor_pb2.py executor_pb2.pyi executor_pb2_grpc.py; do \
		diff -u proto/agent_reach/v1/$$f $$tmp/agent_reach/v1/$$f || \
		{ echo "proto stubs are stale: run 'make proto'"; rm -rf $$tmp; exit 1; }; \
	done; rm -rf $$tmp; echo "proto stubs are fresh"

migrations-check: setup
	$(PY) -m agent_reach_controller.storage.check

bench: setup
	$(PY) -m tests.bench.run
	$(MAKE) --no-print-directory bench-memory

# The http connector's calls/s to a local downstream, SSRF guard on (median of 3).
bench-http: setup
	$(PY) -m tests.bench.http_connector

# grpc.aio's server CPU per exchange: a unary call against a message on one bidi stream.
bench-grpc: setup
	$(PY) -m tests.bench.grpc_calls

# The report path alone: controller and Postgres CPU per result, one and sixteen a report.
bench-report: setup
	$(PY) -m tests.bench.reports

# Our controller's CPU per task beside a skeleton controller's (same stack, no guarantees).
bench-floor: setup
	$(PY) -m tests.bench.floor

# Steps/s and controller CPU per step with 10 k, 100 k and 1 M steps queued behind them.
bench-scale: setup
	$(PY) -m tests.bench.scale

# Memory search on a labelled set: full text on SQLite and Postgres, embeddings from the scripted
# embedder and from WordLlama (weights inside its wheel), which runs in a venv of its own so that
# numpy stays out of the project's.
bench-memory: setup
	test -x $(VENV)/embed/bin/python || $(PYTHON) -m venv $(VENV)/embed
	$(VENV)/embed/bin/python -c 'import wordllama' 2>/dev/null || \
		$(VENV)/embed/bin/pip install --quiet -r requirements/embed.txt
	AGENT_REACH_BENCH_EMBED_PYTHON=$(VENV)/embed/bin/python $(PY) -m tests.bench.memory_recall

# An executor pool token for deploy/compose.yaml: the token in deploy/.env (compose reads it),
# only its hash in deploy/executor-tokens.yaml (the controller's). Both are git-ignored.
compose-token: setup
	@test ! -e deploy/.env || { echo "deploy/.env exists; remove it to make a new token"; exit 1; }
	$(BIN)/reach executors create-token --offline --name compose \
		> deploy/.token 2> deploy/executor-tokens.yaml.tmp
	@printf 'AGENT_REACH_EXECUTOR_TOKEN=%s\n' "$$(cat deploy/.token)" > deploy/.env && rm deploy/.token
	@sed -n '/^tokens:/,$$p' deploy/executor-tokens.yaml.tmp > deploy/executor-tokens.yaml
	@rm deploy/executor-tokens.yaml.tmp
	@echo "wrote deploy/.env (the token) and deploy/executor-tokens.yaml (its hash)"

services-up:
	@pg_isready -q -h 127.0.0.1 -p 5432 || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -n1) main start
	@redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 -::1 \
		--port 6379 --save "" --appendonly no
	@pg_isready -h 127.0.0.1 -p 5432 && redis-cli -h 127.0.0.1 ping

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
