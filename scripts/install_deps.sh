#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages the project needs, only those that are missing. Idempotent and quiet.
# CUDA (nvcc, cuBLASLt, NCCL) is not installed here: it is used from /usr/local/cuda when present.
#   scripts/install_deps.sh [EXTRA_PACKAGE ...]      (extra: also these, e.g. CI's one-node Slurm)
set -euo pipefail
packages=(cmake g++ make ninja-build libopenmpi-dev openmpi-bin libhdf5-dev libeigen3-dev doctest-dev fortunes ccache
  python3 python3-h5py procps nlohmann-json3-dev libsentencepiece-dev zlib1g-dev "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
echo "installing: ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
