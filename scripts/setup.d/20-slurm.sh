#!/usr/bin/env bash
# Slurm (slurmctld, slurmd, client tools) and munge, for the real single-node Slurm that
# the Slurm bridge's tests start (tests/slurm_cluster.py). Installs only when missing.
set -euo pipefail

if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
    && command -v munged >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "20-slurm.sh: no apt-get; install slurmctld, slurmd, slurm-client and munge yourself" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: no mail server, no docs; the services are not started here
# (the test harness starts its own daemons with their own configuration).
$SUDO apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
