#!/usr/bin/env bash
# Installs what the test tiers need on a fresh machine; a no-op when already there.
set -euo pipefail
need_apt=()
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
py_missing=0
python3 -c 'import confluent_kafka, kafka, pytest' >/dev/null 2>&1 || py_missing=1
if [ "$py_missing" = 1 ]; then
  python3 -m pip install -q -r tests/requirements.txt
fi
echo "test dependencies present: kcat $(kcat -V 2>&1 | head -1 | awk '{print $2}'), python $(python3 -c 'import confluent_kafka;print("confluent-kafka", confluent_kafka.version()[0])')"
