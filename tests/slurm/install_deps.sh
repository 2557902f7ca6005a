#!/usr/bin/env bash
# Install what tests/slurm/cluster.sh needs to run a throw-away two-node Slurm cluster:
# Debian's slurm-wlm (slurmctld, slurmd, client tools), munge (authentication), and
# libpmix-dev (slurmd's mpi/pmix plugin dlopen()s libpmix; it must be there BEFORE slurmd
# starts, or `srun --mpi=pmix` reports that the plugin cannot be loaded).
#
# Idempotent: when every package is already installed it does nothing (no apt-get update).
# Non-interactive: safe for CI (no stdin). Needs root (or passwordless sudo).
set -euo pipefail

PKGS=(
  slurm-wlm      # meta package: slurmctld + slurmd + slurm-client (sbatch, srun, scontrol, ...)
  munge          # munged + mungekey: slurm's default auth/munge
  libpmix-dev    # provides the unversioned libpmix.so that slurm's mpi/pmix plugin loads
  util-linux     # unshare + nsenter (the cluster's network, UTS and mount namespaces)
  iproute2       # `ip link set lo up` inside the cluster's new network namespace
)

missing=()
for p in "${PKGS[@]}"; do
  # dpkg-query prints "install ok installed" only for a fully installed package.
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all present (${PKGS[*]})"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo -n"; fi

echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends keeps out mailers and docs; slurm-wlm's hard deps are enough.
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
echo "install_deps: done"
