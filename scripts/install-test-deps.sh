#!/usr/bin/env bash
# Installs what the test tiers need on a fresh machine; a no-op when already there.
set -euo pipefail
need_apt=()
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
# test_tls.py makes its certificates with the openssl command.
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# promtool checks deploy/prometheus/; the e2e tests run a real Prometheus server.
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# tests/e2e/test_burrow.py: Burrow reading Sluice, with ZooKeeper for its coordination
# (the test starts its own ZooKeeper server on a free port).
command -v Burrow >/dev/null 2>&1 || need_apt+=(burrow)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
# tests/e2e/test_lag.py: a real Alertmanager receives the lag alerts.
command -v prometheus-alertmanager >/dev/null 2>&1 || need_apt+=(prometheus-alertmanager)
# tests/e2e/test_go_clients.py: a Go program built in GOPATH mode from Debian's
# sarama and kafka-go sources (/usr/share/gocode).
command -v go >/dev/null 2>&1 || need_apt+=(golang-go)
[ -d /usr/share/gocode/src/github.com/Shopify/sarama ] || need_apt+=(golang-github-shopify-sarama-dev)
[ -d /usr/share/gocode/src/github.com/segmentio/kafka-go ] || need_apt+=(golang-github-segmentio-kafka-go-dev)
# tests/e2e/test_power_loss.py: a volatile disk (tests/e2e/volatile_disk.py), a FUSE
# daemon (fusepy, which loads libfuse2; tested with Debian's 2.9.9) under a loop device
# with ext4 on it.
ldconfig -p 2>/dev/null | grep 'libfuse\.so\.2' >/dev/null || need_apt+=(libfuse2)
command -v losetup >/dev/null 2>&1 || need_apt+=(mount)
command -v e2fsck >/dev/null 2>&1 || need_apt+=(e2fsprogs)
# tests/e2e/test_bare_metal.py: systemd-analyze verifies deploy/systemd/sluice.service.
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# The cargo tiers run under cargo-nextest (on this project's machines already).
cargo nextest --version >/dev/null 2>&1 || cargo install --locked cargo-nextest
py_missing=0
python3 -c 'import confluent_kafka, kafka, pytest, pytest_timeout, xdist, prometheus_client, snappy, lz4.frame, fuse, moto.server, boto3' >/dev/null 2>&1 || py_missing=1
if [ "$py_missing" = 1 ]; then
  python3 -m pip install -q -r tests/requirements.txt
fi
echo "test dependencies present: kcat $(kcat -V 2>&1 | grep -o 'Version [^ ]*' | head -1 | cut -d' ' -f2), confluent-kafka $(python3 -c 'import confluent_kafka;print(confluent_kafka.__version__)'), kafka-python $(python3 -c 'import kafka;print(kafka.__version__)')"
