# One command each, on a fresh machine: `make demo` (the main job), `make test`.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp
export OMP_NUM_THREADS ?= 1

.PHONY: all test test-multihost demo protos etcd venv clean

all: test

# The virtual environment, with the pinned dependencies (constraints.txt pins
# the transitive ones too).
$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $@

venv: $(STAMP)

# Debian's etcd-server (3.4); tests and `omru up` start their own etcd from it.
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
	  echo "installing etcd-server (Debian)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server; }

test: $(STAMP) etcd
	$(BIN)/python -m pytest

# Hosts as network namespaces (head, host-a, host-b; needs root and iproute2):
# a job across two hosts, a lost host, etcd restarted mid-run.
test-multihost: $(STAMP) etcd
	$(BIN)/python -m pytest -m multihost tests/multihost

demo: $(STAMP) etcd
	$(BIN)/omru demo

# Regenerate the gRPC stubs in omru/v1 from protos/ (tests/ prove them current).
protos: $(STAMP)
	$(BIN)/python -m omru.protogen

clean:
	rm -rf $(VENV) .pytest_cache
