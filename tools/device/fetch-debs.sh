#!/usr/bin/env bash
# Downloads the Debian 12 (bookworm, amd64) packages that an offline GPU machine needs to build ptrain
# beside PyTorch's wheel, into tools/device/debs/ (git-ignored), for tools/device/check.sh to unpack there.
#
#   tools/device/fetch-debs.sh          # on Debian 12 with network; no root needed (apt-get download)
#
# Today: 18 files, 12.5 MiB, 9.1 MiB of it libboost1.74-dev (the Boost headers, 135 MB unpacked).
#
# The wheel brings libtorch (CUDA, c10d, NCCL); these bring the rest: yaml-cpp, spdlog, fmt, Boost headers
# and Boost.Filesystem, GoogleTest/GoogleMock, CLI11, nlohmann-json and Gloo's headers, each with the
# runtime library it links (a fresh Ubuntu 24.04 has other sonames: yaml-cpp 0.8, spdlog 1.12, Boost 1.83).
# The libraries need only libc6, libgcc-s1 and libstdc++6, which every glibc >= 2.36 system has.
#
# Idempotent: a .deb already present with the size and SHA-256 the archive lists is kept, other versions
# of the listed packages and files of packages no longer listed are removed. Prints each file and the
# total, and fails if the folder exceeds 40 MiB (the working tree copied to the GPU machine is limited
# to 64 MiB in all). Needs apt's package lists (`sudo apt-get update` once if apt-cache knows nothing).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
dest="$here/debs"
limit_mib=40

packages=(
  libyaml-cpp-dev libyaml-cpp0.7                              # yaml-cpp 0.7.0
  libspdlog-dev libspdlog1.10                                 # spdlog 1.10 (external fmt)
  libfmt-dev libfmt9                                          # fmt 9.1
  libboost1.74-dev                                            # Boost headers and BoostConfig (~9 MiB)
  libboost-filesystem1.74-dev libboost-filesystem1.74.0
  libboost-system1.74-dev libboost-system1.74.0               # boost_filesystem-config needs boost_system
  libgtest-dev libgmock-dev                                   # GoogleTest 1.12 (static libraries)
  libcli11-dev                                                # CLI11 2.1 (headers)
  nlohmann-json3-dev                                          # nlohmann-json 3.11 (headers)
  libgloo-dev                                                 # headers only: libtorch has Gloo itself
  zlib1g-dev zlib1g                                           # zlib (datasets/mosaic reads gzip files)
)

if [ -r /etc/os-release ]; then
  # shellcheck disable=SC1091
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  if [ "$codename" != "bookworm" ]; then
    echo "fetch-debs: this host is '${codename:-unknown}', not Debian 12 (bookworm): the package names" \
         "and versions above are bookworm's" >&2
    exit 1
  fi
fi
if ! apt-cache show --no-all-versions "${packages[0]}" >/dev/null 2>&1; then
  echo "fetch-debs: apt knows no package ${packages[0]}; run 'sudo apt-get update' first" >&2
  exit 1
fi

mkdir -p "$dest"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# One line per package: 'URL' FILE SIZE SHA256:HEX (amd64 whatever this host is). Asked in an empty
# folder: apt leaves out the files already present in the current one.
uris=$(cd "$scratch" && apt-get download --print-uris "${packages[@]/%/:amd64}")
cd "$dest"
wanted=()
while read -r _url file size hash; do
  [ -n "${file:-}" ] || continue
  wanted+=("$file")
  if [ -f "$file" ] && [ "$(stat -c %s "$file")" = "$size" ] &&
     [ "SHA256:$(sha256sum "$file" | cut -d' ' -f1)" = "$hash" ]; then
    continue
  fi
  rm -f "$file"
  pkg=${file%%_*}
  echo "fetch-debs: downloading $file"
  # (as root apt warns that it downloads unsandboxed; the check below is what counts)
  (cd "$scratch" && { apt-get download -qq "$pkg:amd64" 2>&1 | grep -v "^W: Download is performed unsandboxed"; }) || true
  mv -f "$scratch/$file" . 2>/dev/null || true
  if [ ! -f "$file" ] || [ "SHA256:$(sha256sum "$file" | cut -d' ' -f1)" != "$hash" ]; then
    echo "fetch-debs: $file did not arrive intact" >&2
    exit 1
  fi
done <<<"$uris"

# Anything else here is an old version or a package no longer listed.
for f in *.deb; do
  [ -e "$f" ] || continue
  keep=0
  for w in "${wanted[@]}"; do [ "$f" = "$w" ] && keep=1 && break; done
  if [ $keep -eq 0 ]; then
    echo "fetch-debs: removing $f (not listed)"
    rm -f "$f"
  fi
done

total=0
for f in "${wanted[@]}"; do
  size=$(stat -c %s "$f")
  total=$((total + size))
  awk -v s="$size" -v f="$f" 'BEGIN { printf "%9.2f MiB  %s\n", s / 1048576, f }'
done
awk -v s="$total" -v n="${#wanted[@]}" -v d="$dest" 'BEGIN { printf "%9.2f MiB  total, %d files in %s\n", s / 1048576, n, d }'
if [ "$total" -gt $((limit_mib * 1048576)) ]; then
  echo "fetch-debs: more than $limit_mib MiB; the tree copied to the GPU machine must stay under 64 MiB" >&2
  exit 1
fi
