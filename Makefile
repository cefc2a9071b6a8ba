# kneeswarm: the two commands of the README, and a few for developers.
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp
# the versions the suite passes with: make and CI install them; pyproject.toml keeps users' ranges
CONSTRAINTS = constraints.txt
# Debian packages the tests run for real: pidstat (sysstat), vmstat (procps), a real sshd
# (openssh-server), clock-shifted agents (faketime), network namespaces (iproute2), the web UI
# in a headless browser (chromium, driven by playwright with its executable path: never
# `playwright install`), a minimal container's userland for the shell agent (busybox), a
# TLS-terminating proxy (nginx, run from a test's own config, never the system service).
DEBS    = sysstat procps openssh-server faketime iproute2 chromium busybox nginx
PYTEST_ARGS ?=

.PHONY: demo test test-long typecheck test-fast conformance conformance-debs bench debs clean constraints docs

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[demo,test]' -c $(CONSTRAINTS)
	touch $@

demo: $(STAMP)
	$(VENV)/bin/kneeswarm demo

# `make docs`: the site (docs/, README.md its front page) into build/docs/, every warning an error (a
# broken link or heading anchor, a page in no toctree), all of them reported before it fails.  The
# docs extra goes into the same venv under a stamp of its own, so `make test` installs nothing more.
DOCS_STAMP = $(VENV)/.docs-stamp
DOCS_OUT   = build/docs

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[docs]' -c $(CONSTRAINTS)
	touch $@

docs: $(DOCS_STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs $(DOCS_OUT)
	@echo "docs: $(DOCS_OUT)/index.html"

# `make test`: every test but the long real-run scenarios (marked `long`: 20 s or more each, the
# real-run scenarios that show each feature end to end); `make test-long` runs those (31 min on 2 cores).
# CI (.ci/run) runs `make test`, not the long tier: both would not fit its 50-minute budget.
test: $(STAMP) debs typecheck
	$(PY) -m pytest -m 'not long' $(PYTEST_ARGS)

test-long: $(STAMP) debs
	$(PY) -m pytest -m long $(PYTEST_ARGS)

# mypy over kneeswarm/, locustfiles/, agents/, collectors/, analysis/ (pyproject [tool.mypy]);
# 6-16 s cold on 2 shared cores, under 1 s with its cache
typecheck: $(STAMP)
	$(PY) -m mypy

test-fast: $(STAMP)
	$(PY) -m pytest -m 'not slow' $(PYTEST_ARGS)

# Real inference servers (llama.cpp, ...) driven by a real run: tests_conformance/.  Each server is
# installed by the suite itself into ~/.cache/kneeswarm-conformance/<server>-<version> (reused when
# there; KNEESWARM_CONFORMANCE_CACHE moves it); a server that cannot be installed fails.
conformance: $(STAMP) debs conformance-debs
	$(PY) -m pytest tests_conformance -p no:cacheprovider $(PYTEST_ARGS)

# What the conformance servers need from Debian: a C++ toolchain, CMake and Ninja to build
# llama.cpp's server, Java for TorchServe, Debian's own Python 3.11 with venv for Triton's Python
# backend (pytriton's stub links the system's libpython3.11).
conformance-debs:
	@missing=""; \
	command -v cmake >/dev/null 2>&1 || missing="$$missing cmake"; \
	command -v ninja >/dev/null 2>&1 || missing="$$missing ninja-build"; \
	command -v g++ >/dev/null 2>&1   || missing="$$missing g++"; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	/usr/bin/python3.11 -c 'import ensurepip' >/dev/null 2>&1 || missing="$$missing python3.11 python3.11-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

bench: $(STAMP)
	$(PY) bench/generator.py
	$(PY) bench/distributed.py

# Install the Debian packages the tests need, only when a tool is missing.
debs:
	@missing=""; \
	command -v pidstat >/dev/null 2>&1 || missing="$$missing sysstat"; \
	command -v vmstat  >/dev/null 2>&1 || missing="$$missing procps"; \
	test -x /usr/sbin/sshd             || missing="$$missing openssh-server"; \
	command -v faketime >/dev/null 2>&1 || missing="$$missing faketime"; \
	command -v ip >/dev/null 2>&1      || missing="$$missing iproute2"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v busybox >/dev/null 2>&1 || missing="$$missing busybox"; \
	command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || missing="$$missing nginx"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# After a change of dependencies: record the versions of a venv the whole suite passed in.
constraints: $(STAMP) $(DOCS_STAMP)
	{ sed -n '/^#/p' $(CONSTRAINTS); $(PY) -m pip freeze --all --exclude-editable | grep -v -e '^#' -e '^pip==' -e '^wheel=='; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache
