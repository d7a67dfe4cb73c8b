#!/usr/bin/env bash
# Checks the shipped Prometheus rules (deploy/prometheus/): syntax and expressions with
# `promtool check rules`, behaviour with the unit tests in sluice-rules.test.yml
# (`promtool test rules`). `make lint` runs it; promtool is Debian's `prometheus`
# package (scripts/install-test-deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/../deploy/prometheus"
if ! command -v promtool >/dev/null 2>&1; then
  echo "check-prometheus-rules: promtool not found; run make deps (Debian package prometheus)" >&2
  exit 1
fi
promtool check rules sluice-rules.yml
promtool test rules sluice-rules.test.yml
