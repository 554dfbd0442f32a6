#!/usr/bin/env bash
# Slurm (slurmctld, slurmd, client tools), munge, and slurmdbd on MariaDB, for the real
# single-node Slurm that the Slurm tests start (tests/slurm_cluster.py; slurmdbd for the
# sacct import's tests). Installs only when missing.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
if have slurmctld && have slurmd && have munged && have sbatch && have slurmdbd \
    && have sacct && have mariadbd && have mariadb-install-db; then
    exit 0
fi
if ! have apt-get; then
    echo "20-slurm.sh: no apt-get; install slurmctld, slurmd, slurm-client, munge," \
         "slurmdbd and mariadb-server yourself" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: no mail server, no docs; the services are not started here
# (the test harness starts its own daemons with their own configuration and data folders).
$SUDO apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge \
    slurmdbd mariadb-server >/dev/null
