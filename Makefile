# make test: install everything from scratch, then lint, format check, types and every test.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: test checks check lint unit mutate e2e $(E2E_TARGETS) unit-deps fleet-deps fleet-images floor-venv wheel-venv demo demo-down install clean

# The readers the unit tests hand rendered files to (tests/unit/consumers.py): nft, promtool, amtool; curl runs health.serving.
# systemd-analyze and ip come with the machine's image (systemd, iproute2).
UNIT_PACKAGES = nftables prometheus prometheus-alertmanager curl
# Debian packages the simulated fleet needs (tests/fleet/fleet.py), and the Prometheus tests/e2e/test_observe.py runs.
FLEET_PACKAGES = docker.io debootstrap docker-registry openssh-client curl $(UNIT_PACKAGES)

# The oldest pyinfra pyproject.toml admits; tests/e2e/test_floor.py deploys with it (test_docs checks they agree).
PYINFRA_FLOOR = 3.9
FLOOR_VENV = .venv-floor

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

lint: install
	$(BIN)/ruff check instinct_fleet scripts tests group_data inventories deploy.py config.py benchmarks
	$(BIN)/ruff format --check instinct_fleet scripts tests group_data inventories deploy.py config.py benchmarks
	$(BIN)/mypy

unit: install unit-deps
	$(BIN)/pytest tests/unit

# The quick inner loop: lint, format check, types and the unit tests (no fleet), with the
# consumer property at 40 examples instead of make test's 150.
check: lint
	INSTINCT_FLEET_CONSUMER_EXAMPLES=40 $(MAKE) --no-print-directory unit

# Plants each small bug of scripts/mutate.py's table in the verdict code (noise, canary, report, validation) and
# shows that a test fails on it; not part of make test (a few minutes), its table's anchors are checked there.
mutate: install unit-deps
	$(BIN)/python scripts/mutate.py

# Installs what is missing of a list of Debian packages.
apt_install = missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "apt-get install $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

unit-deps:
	@$(call apt_install,$(UNIT_PACKAGES) systemd iproute2)

fleet-deps:
	@$(call apt_install,$(FLEET_PACKAGES))

$(FLOOR_VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/pip install --quiet 'pyinfra==$(PYINFRA_FLOOR)' 'jinja2>=3.1' 'pydantic>=2.7,<3' 'rich>=13' 'PyYAML>=6'
	$(FLOOR_VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

floor-venv: $(FLOOR_VENV)/.installed

# The wheel built from this checkout, installed (not editable, with its verify extra) in a venv of its own, as a
# team installs it: tests/e2e/test_package.py deploys from an `instinct-fleet init` project with it. Built
# beside the fleet images, so it costs the end-to-end shares no time.
WHEEL_VENV = .venv-wheel
PACKAGE_FILES = $(shell find instinct_fleet -type f -not -path '*/__pycache__/*')

$(WHEEL_VENV)/.installed: pyproject.toml $(PACKAGE_FILES)
	rm -rf $(WHEEL_VENV)
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip wheel --quiet --no-deps -w $(WHEEL_VENV)/dist .
	$(WHEEL_VENV)/bin/pip install --quiet "instinct-fleet[verify] @ file://$$(ls $(CURDIR)/$(WHEEL_VENV)/dist/*.whl)"
	touch $@

wheel-venv: $(WHEEL_VENV)/.installed

# End to end: the real CLI and pyinfra over SSH, testinfra, on simulated fleets. One fleet leaves the
# CPU idle for much of the run (health gates, restarts, timeouts), so the modules run in shares at
# once, each share on its own fresh fleet (INSTINCT_FLEET_SLOT=N): a module names its share in
# FLEET_SHARE (default 0). Three shares of about 18 minutes each on 2 cores (benchmarks/RESULTS.md, make test): the
# machine is busy throughout, and a fourth share made every share slower (one run: 24 min against 21).
E2E_SHARES  = 0 1 2
E2E_TARGETS = $(addprefix e2e-,$(E2E_SHARES))

e2e: fleet-images install fleet-deps floor-venv wheel-venv
	$(MAKE) --no-print-directory -j$(words $(E2E_SHARES)) --output-sync=target $(E2E_TARGETS)

# fleet-images first: make starts prerequisites in the order listed, and with -j3 the images (the longest
# step) would otherwise wait for a venv to free a job slot.
$(E2E_TARGETS): e2e-%: fleet-images install fleet-deps floor-venv wheel-venv
	INSTINCT_FLEET_SLOT=$* $(BIN)/pytest -p no:cacheprovider tests/e2e --fleet-share $* --fleet-shares $(words $(E2E_SHARES)) --durations=0

# dockerd and the images every fleet runs (a no-op once built); stdlib only, so it runs while pip installs.
# Its Debian packages are checked in its own recipe, not as a prerequisite job: with -j3, make gave the
# job slot that such a prerequisite freed to a venv, and the images (the longest step) started 27 s late.
fleet-images:
	@$(call apt_install,$(FLEET_PACKAGES))
	$(PYTHON) tests/fleet/fleet.py images

# The Debian packages first (one apt-get at a time); then the venvs and the fleet images at once, and
# every end-to-end share beside lint, types and unit tests. Each target's output is printed whole when it ends.
test: unit-deps fleet-deps
	$(MAKE) --no-print-directory -j$(words checks $(E2E_SHARES)) --output-sync=target checks $(E2E_TARGETS)

# The unit tests run at a lower CPU priority: the end-to-end tests' timings (probe rates, health gates) come first.
checks: lint
	nice -n 15 $(MAKE) --no-print-directory unit

# The quick start: a local simulated fleet, the default recipe deployed, a sample completion.
demo: install fleet-deps
	$(BIN)/python tests/fleet/fleet.py up
	-$(BIN)/instinct-fleet deploy inventories/local.py -y
	$(BIN)/python tests/fleet/fleet.py sample

demo-down:
	for slot in $(E2E_SHARES); do INSTINCT_FLEET_SLOT=$$slot $(PYTHON) tests/fleet/fleet.py down || exit 1; done

clean: demo-down
	rm -rf $(VENV) $(FLOOR_VENV) $(WHEEL_VENV) .mypy_cache .pytest_cache .ruff_cache .fleet
