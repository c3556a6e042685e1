# The two quickstart commands: `make serve` and `make test`. Each creates .venv when missing
# and installs what it needs; nothing else has to be on the machine but Python 3.11 (and Java 17
# for the Spark parts).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DATA   ?= ./data

.PHONY: serve test install install-test proto clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install -q -e .

# The Liftbridge protobuf/gRPC modules (riverlog/protocol/liftbridge/api_pb2*.py, not committed)
# are generated from api.proto by setup.py on every `pip install -e`, so `make install`,
# `make install-test` and `make test` regenerate them; `make proto` after editing api.proto.
proto: install

# The web view's test drives Debian's chromium (tests/server/test_management_web.py), and the
# Iceberg catalog on PostgreSQL is tested against Debian's postgresql (initdb, pg_ctl; the
# test runs it as the `postgres` user when root; tests/cluster/test_iceberg_cluster.py): each
# installed here when missing and apt-get can (as root); elsewhere those tests are skipped,
# saying why.
install-test: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	@if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium (apt-get) for the web view's test"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	      || echo "note: chromium could not be installed: the web view's test will be skipped"; \
	  else echo "note: no chromium and no root apt-get: the web view's test will be skipped"; fi; \
	fi
	@if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing postgresql (apt-get) for the Iceberg catalog test on PostgreSQL"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null \
	      || echo "note: postgresql could not be installed: the PostgreSQL catalog test will be skipped"; \
	  else echo "note: no postgresql and no root apt-get: the PostgreSQL catalog test will be skipped"; fi; \
	fi

serve: install
	$(BIN)/riverlog serve --data-dir $(DATA)

# pytest exits 5 when it collects no tests: that is a failure here too.
test: install-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info riverlog/protocol/liftbridge/*_pb2*.py*
