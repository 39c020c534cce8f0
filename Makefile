# oncelog: the README's commands. Every target that needs Python creates .venv through `setup`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench soak clean java-check

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/check_java.sh
	@bash scripts/check_java.sh
	@if [ ! -x $(BIN)/python ]; then $(PYTHON) -m venv $(VENV); fi
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@if ! command -v kcat >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing kcat (Debian package) for the compatibility tests"; \
		(apt-get install -y -q kcat >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q kcat >/dev/null 2>&1)) || echo "kcat could not be installed; its tests will be skipped with a reason"; \
	fi
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1 \
		&& [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing PostgreSQL (Debian package) for the database sink tests"; \
		(apt-get install -y -q postgresql >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q postgresql >/dev/null 2>&1)) || echo "PostgreSQL could not be installed; its tests will be skipped with a reason"; \
	fi
	@test -x $(BIN)/oncelog
	@touch $(STAMP)

java-check:
	@bash scripts/check_java.sh

demo: setup
	$(BIN)/oncelog demo

test: setup
	$(BIN)/ruff check src tests
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/mypy

bench: setup
	$(BIN)/oncelog bench

# A longer verify run with every fault, including SIGKILL/SIGSTOP of the broker (minutes).
SOAK_DIR := $(shell mktemp -d -u /tmp/oncelog-soak.XXXXXX)
soak: setup
	$(BIN)/oncelog verify --duration 240 --seed $${SEED:-7} \
		--faults drop,reset,delay,zombie,crash,broker-kill,broker-pause \
		--broker-cmd "$(CURDIR)/$(BIN)/python -m oncelog broker --data-dir $(SOAK_DIR) --listen 127.0.0.1:{port}" \
		--report soak-report.html --history $(SOAK_DIR)-history.jsonl

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
