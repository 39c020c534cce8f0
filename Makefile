# oncelog: the README's commands. Every target that needs Python creates .venv through `setup`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench soak fuzz clean java-check

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
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Chromium (Debian package) for the report tests (headless rendering)"; \
		(apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) || echo "Chromium could not be installed; the report rendering tests will fail saying so"; \
	elif ! command -v chromium >/dev/null 2>&1; then \
		echo "Chromium is missing and this is not root with apt-get: install Debian's chromium package, or the report rendering tests will fail saying so"; \
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
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not lazyfs" -n 2 --dist loadfile --no-loadscope-reorder tests

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# Our broker and the Tansu broker side by side (about a quarter of an hour): the table in the terminal,
# bench-report/report.html with the charts, bench-report/bench.json with every raw figure.
bench: setup
	$(BIN)/oncelog bench --out bench-report

# A longer verify run with every fault, including SIGKILL/SIGSTOP of the broker (minutes).
SOAK_DIR := $(shell mktemp -d -u /tmp/oncelog-soak.XXXXXX)
soak: setup
	$(BIN)/oncelog verify --duration 240 --seed $${SEED:-7} \
		--faults drop,reset,delay,zombie,crash,broker-kill,broker-pause \
		--broker-cmd "$(CURDIR)/$(BIN)/python -m oncelog broker --data-dir $(SOAK_DIR) --listen 127.0.0.1:{port}" \
		--report soak-report.html --history $(SOAK_DIR)-history.jsonl

# Power cuts through LazyFS (tests/faults/power_cut.py), both fsync modes, POWER_CUT_ROUNDS rounds each.
# ONCELOG_LAZYFS names the LazyFS binary; POWER_CUT_PYTHON picks the broker's interpreter (another checkout).
.PHONY: power-cut
POWER_CUT_ROUNDS ?= 20
POWER_CUT_PYTHON ?= $(CURDIR)/$(BIN)/python
power-cut: setup
	@if [ -z "$$ONCELOG_LAZYFS" ]; then \
		echo "make power-cut: set ONCELOG_LAZYFS to a LazyFS binary (https://github.com/dsrhaslab/lazyfs)" >&2; \
		exit 2; fi
	$(BIN)/python -m tests.faults.power_cut --lazyfs "$$ONCELOG_LAZYFS" --mode both \
		--rounds $(POWER_CUT_ROUNDS) --seed $${SEED:-1} --python "$(POWER_CUT_PYTHON)"

# Long adversarial runs (about an hour): the transaction model for 12,000 steps, the group and
# connection models (2,000 and 3,000 runs), 1,000 power cuts per fsync mode on the recording file
# system, and, when ONCELOG_LAZYFS names a LazyFS binary, the power cuts through LazyFS too, and the
# socket fuzz for 15 minutes per fsync mode.
fuzz: setup
	ONCELOG_MODEL_EXAMPLES=400 $(BIN)/python -m pytest -q -p no:cacheprovider --timeout 0 \
		tests/transactions/test_txn_model.py
	ONCELOG_GROUP_MODEL_EXAMPLES=2000 $(BIN)/python -m pytest -q -p no:cacheprovider --timeout 0 \
		tests/coordinator/test_group_membership_model.py
	ONCELOG_CONNECTION_MODEL_EXAMPLES=3000 $(BIN)/python -m pytest -q -p no:cacheprovider --timeout 0 \
		tests/server/test_connection_model.py
	ONCELOG_POWER_CUT_ROUNDS=1000 ONCELOG_POWER_CUT_SEED=$${SEED:-1000} $(BIN)/python -m pytest -q \
		-p no:cacheprovider --timeout 0 tests/storage/test_power_cut.py
	@if [ -n "$$ONCELOG_LAZYFS" ]; then $(MAKE) power-cut; \
		else echo "fuzz: ONCELOG_LAZYFS is not set; the LazyFS power cuts were not run (make power-cut)"; fi
	ONCELOG_FUZZ_SECONDS=$${ONCELOG_FUZZ_SECONDS:-900} ONCELOG_FUZZ_SEED=$${SEED:-1} $(BIN)/python -m pytest -q \
		-p no:cacheprovider --timeout 0 -s tests/server/test_fuzz_requests.py -k socket_fuzz

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
