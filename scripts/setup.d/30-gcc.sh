#!/usr/bin/env bash
# gcc builds the fake NVML driver library (tests/fake_nvml/fake_nvml.c) in the test harness.
set -euo pipefail
command -v gcc >/dev/null 2>&1 && exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq gcc libc6-dev >/dev/null
