#!/usr/bin/env bash
# Prometheus and promtool (Debian's `prometheus` package) for the alert-rule unit tests
# (promtool test rules) and the tests that start a real Prometheus scraping the exporter
# (tests/prometheus_server.py); amtool (`prometheus-alertmanager`) checks the compose
# stack's Alertmanager configuration (tests/test_compose.py). Installs only when missing; the packaged service is not
# used (the tests start their own server with a temporary configuration).
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 \
    && command -v amtool >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "10-prometheus.sh: no apt-get; install prometheus (with promtool) and amtool yourself" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# policy-rc.d keeps the package from starting its own service inside containers
$SUDO apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null
