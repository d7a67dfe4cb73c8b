# Sluice — see README.md. Every target works on a fresh machine: `make test` installs
# what the tests need first (scripts/install-test-deps.sh).
CARGO ?= cargo
DATA_DIR ?= ./data
LISTEN ?= 127.0.0.1:9092

.PHONY: run build release test test-long lint tidy test-build unit e2e deps bench bench-ab fuzz sim clean cluster cluster-stop cluster-status

run: release
	@echo "Sluice: Kafka API on $(LISTEN), data under $(DATA_DIR). Try: kcat -b $(LISTEN) -L"
	@echo "Metrics: http://$(word 1,$(subst :, ,$(LISTEN))):$$(( $(word 2,$(subst :, ,$(LISTEN))) + 552 ))/metrics (also /health, /ready)"
	./target/release/sluice serve --listen $(LISTEN) --data-dir $(DATA_DIR)

# A local 3-broker cluster: Kafka on 127.0.0.1:9092-9094, controllers on 9192-9194,
# data and logs under $(DATA_DIR)/cluster (scripts/cluster.sh).
cluster: release
	CLUSTER_DIR=$(DATA_DIR)/cluster bash scripts/cluster.sh start

cluster-stop:
	CLUSTER_DIR=$(DATA_DIR)/cluster bash scripts/cluster.sh stop

cluster-status:
	CLUSTER_DIR=$(DATA_DIR)/cluster bash scripts/cluster.sh status

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release --workspace

deps:
	bash scripts/install-test-deps.sh

# The cargo tiers and the e2e brokers share one build, profile `unit` (release without
# LTO and debug info; see Cargo.toml): the workspace compiles once per `make test`.
# clippy runs inside that build, as the workspace's compiler wrapper (what `cargo
# clippy` does, with code generation kept), so linting costs no second compilation.
# Tests run optimised, where debug_assert! never fires: invariants use assert!.
CLIPPY_DRIVER := $(shell command -v clippy-driver 2>/dev/null)
TEST_CARGO = RUSTC_WORKSPACE_WRAPPER="$(CLIPPY_DRIVER)" CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__" $(CARGO)
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)

# What lint checks besides clippy (whose workspace lints, Cargo.toml and clippy.toml,
# also forbid debug_assert!): formatting, src/ imports only downward through the layer
# folders listed in src/lib.rs, the shipped Prometheus rules pass
# promtool's check and their unit tests, and the fuzz target (outside the workspace: it
# needs nightly to run) still builds against the broker (a unit test replays its corpus).
tidy:
	$(CARGO) fmt --all -- --check
	CARGO_TARGET_DIR=$(TARGET_DIR)/fuzz $(CARGO) check --quiet --manifest-path fuzz/Cargo.toml
	python3 scripts/check-layers.py
	bash scripts/check-prometheus-rules.sh

# Standalone lint (a quick check build): `make test` lints inside its one build instead.
lint: tidy
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Every target of the workspace (libraries, binaries, test binaries) in profile `unit`,
# linted by clippy as it compiles.
test-build:
	@test -n "$(CLIPPY_DRIVER)" || { echo "clippy-driver not found: rustup component add clippy"; exit 1; }
	$(TEST_CARGO) build --workspace --all-targets --profile unit

# Tiers: unit + property + crash-recovery + simulation tests (cargo, run by
# cargo-nextest: each test its own process, binaries in parallel, a hang ends at 5 min;
# .config/nextest.toml), then end-to-end tests against real broker processes with real
# Kafka clients (tests/e2e, pytest with a per-test timeout; scripts/run-e2e.sh).
unit: test-build
	$(TEST_CARGO) nextest run --workspace --cargo-profile unit
	@python3 scripts/slowest-tests.py "cargo tests (nextest)" $(TARGET_DIR)/nextest/default/junit.xml

e2e: test-build
	SLUICE_BIN=$(TARGET_DIR)/unit/sluice bash scripts/run-e2e.sh
	@python3 scripts/slowest-tests.py "end-to-end tests (pytest)" $(TARGET_DIR)/e2e-junit.xml

test: deps tidy unit e2e

# The long runs `make test` takes a slice of: thousands of replication-simulation seeds
# (make sim), the transaction simulation and the storage property tests at ten times
# their cases, and the 10,000-partition scale run of one broker and of three (make
# bench's scale table, scripts/bench-scale.sh).
test-long: sim test-build release
	SLUICE_TXN_SIM_SEEDS=1500 PROPTEST_CASES=450 $(TEST_CARGO) nextest run --workspace --cargo-profile unit
	bash scripts/bench-scale.sh

bench: release
	bash scripts/bench.sh

# Two builds side by side in one run: make bench-ab BASE_BIN=/path/to/old/sluice
bench-ab: release
	bash scripts/bench-ab.sh $(BASE_BIN) ./target/release/sluice

fuzz:
	bash scripts/fuzz.sh

# Deterministic replication simulation (replication/src/sim.rs): thousands of seeds of
# crashes, isolations, lossy networks and stale metadata; a failure prints its seed and
# the command that replays it with a trace.
SIM_SEEDS ?= 5000
sim:
	$(CARGO) run --release -p sluice-replication --bin sluice-sim -- --seeds $(SIM_SEEDS)
	$(CARGO) run --release -p sluice-replication --bin sluice-sim -- --seeds $$(( $(SIM_SEEDS) / 5 )) --start 1000001 --brokers 5 --partitions 4

clean:
	$(CARGO) clean
	rm -rf $(DATA_DIR) bench/results
