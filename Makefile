# Sluice — see README.md. Every target works on a fresh machine: `make test` installs
# what the tests need first (scripts/install-test-deps.sh).
CARGO ?= cargo
DATA_DIR ?= ./data
LISTEN ?= 127.0.0.1:9092

.PHONY: run build release test lint unit e2e deps bench fuzz clean

run: release
	@echo "Sluice: Kafka API on $(LISTEN), data under $(DATA_DIR). Try: kcat -b $(LISTEN) -L"
	./target/release/sluice serve --listen $(LISTEN) --data-dir $(DATA_DIR)

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release --workspace

deps:
	bash scripts/install-test-deps.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Tiers: unit + property + crash-recovery tests (cargo), then end-to-end tests
# against real broker processes with real Kafka clients (tests/).
unit:
	$(CARGO) test --workspace --release

e2e: release
	bash scripts/run-e2e.sh

test: deps lint unit e2e

bench: release
	bash scripts/bench.sh

fuzz:
	bash scripts/fuzz.sh

clean:
	$(CARGO) clean
	rm -rf $(DATA_DIR) bench/results
