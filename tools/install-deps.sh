#!/usr/bin/env bash
# Installs ptrain's build and test dependencies from Debian packages.
# Idempotent: packages already present are left alone, and apt is not touched
# at all when everything is installed.
set -euo pipefail

packages=(
  build-essential cmake make pkg-config
  libtorch-dev            # libtorch 1.13 (CPU) with c10d Gloo
  libopenblas0-pthread    # without it matrix products use reference BLAS (~50x slower)
  libyaml-cpp-dev
  libboost-dev libboost-filesystem-dev
  libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev
  libcli11-dev
  libgloo-dev             # headers for c10d ProcessGroupGloo (the library ships with libtorch)
  nlohmann-json3-dev
  python3-torch           # PyTorch eager on the same libtorch, for `make bench`
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
