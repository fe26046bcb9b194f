#!/usr/bin/env bash
# Debian packages for a one-node Slurm cluster on localhost (scripts/cluster/localslurm.py and
# the `slurm` tests in tests/cluster/). Idempotent. Needs root and apt-get; elsewhere it says
# why and exits 0, and the slurm tests skip with that reason. As root on Debian a failed
# install fails (CI must run those tests).
set -euo pipefail

PACKAGES=(slurmctld slurmd slurmdbd slurm-client munge mariadb-server)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "cluster: ${PACKAGES[*]} already installed"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "cluster: cannot install ${missing[*]} (needs root and apt-get); the slurm tests will skip"
  exit 0
fi

# The packages' maintainer scripts must not start system daemons (MariaDB, munge, Slurm): the
# tests start their own, on their own ports and folders. policy-rc.d exit 101 = "not allowed".
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
start=$(date +%s)
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "cluster: installed ${missing[*]} in $(( $(date +%s) - start )) s"
