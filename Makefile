# Sluice — see README.md. Every target works on a fresh machine: `make test` installs
# what the tests need first (scripts/install-test-deps.sh).
CARGO ?= cargo
DATA_DIR ?= ./data
LISTEN ?= 127.0.0.1:9092

.PHONY: run build release test lint unit e2e deps bench bench-ab fuzz sim clean cluster cluster-stop cluster-status

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

# Tests run optimised (profile `unit`: release without LTO and debug info), where
# debug_assert! never fires: invariants use assert!.
# src/ imports only downward through the layers listed in src/lib.rs.
# The shipped Prometheus rules pass promtool's check and their unit tests.
# The fuzz target lives outside the workspace (it needs nightly to run); check that it
# still builds against the broker (its corpus is replayed by a unit test).
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@if grep -rn --include='*.rs' 'debug_assert' src shard storage replication bench; then \
		echo "lint: use assert! (make unit runs in release, where debug_assert! is off)"; exit 1; fi
	$(CARGO) check --quiet --manifest-path fuzz/Cargo.toml
	python3 scripts/check-layers.py
	bash scripts/check-prometheus-rules.sh

# Tiers: unit + property + crash-recovery tests (cargo), then end-to-end tests
# against real broker processes with real Kafka clients (tests/).
unit:
	$(CARGO) test --workspace --profile unit

e2e: release
	bash scripts/run-e2e.sh

test: deps lint unit e2e

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
