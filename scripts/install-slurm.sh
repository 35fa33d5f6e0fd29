#!/bin/bash
# Installs Debian's Slurm (slurm-wlm: slurmctld, slurmd, srun) and munge, which
# tests/group/srun.sh needs to start N ranks of an rdx program under srun. Not
# part of the quick start: the core and CI need neither. Run as root (or with sudo).
set -eu
pkgs=(slurm-wlm munge)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-slurm.sh: ${pkgs[*]} already installed"
  exit 0
fi
echo "install-slurm.sh: apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
# munge's postinst makes /etc/munge/munge.key; srun.sh runs munged on a copy of it.
[ -r /etc/munge/munge.key ] || { echo "install-slurm.sh: no /etc/munge/munge.key after the install" >&2; exit 1; }
echo "install-slurm.sh: done ($(slurmctld -V))"
