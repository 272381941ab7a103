#!/usr/bin/env bash
# Installs ptrain's build and test dependencies from Debian packages.
# Idempotent: packages already present are left alone, and apt is not touched
# at all when everything is installed.
#
#   tools/install-deps.sh          the Debian set (libtorch 1.13, CPU)
#   tools/install-deps.sh --pypi   the Debian set, then PyTorch 2.x from PyPI (with CUDA)
#                                  into .venv-torch/ in the tree (git ignores it), for
#                                  `make TORCH=pypi`. PTRAIN_TORCH_SPEC overrides the
#                                  pinned version (default below).
set -euo pipefail
cd "$(dirname "$0")/.."

pypi=0
for arg in "$@"; do
  case "$arg" in
    --pypi) pypi=1 ;;
    *) echo "install-deps: unknown option '$arg' (expected --pypi)" >&2; exit 2 ;;
  esac
done
torch_spec="${PTRAIN_TORCH_SPEC:-torch==2.15.0}"
# Pinned as tested: GPT-2's layout and megatron's sample indices are what the
# tests compare with.
transformers_spec="transformers==5.25.0"
megatron_spec="megatron-core==0.16.1"
tensorboard_spec="tensorboard==2.21.0"

packages=(
  build-essential cmake make pkg-config
  ccache                  # compiled objects cached outside the clone (cmake/ccache.cmake)
  libtorch-dev            # libtorch 1.13 (CPU) with c10d Gloo
  libopenblas0-pthread    # without it matrix products use reference BLAS (~50x slower)
  libyaml-cpp-dev
  libboost-dev libboost-filesystem-dev
  libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev
  libcli11-dev
  libgloo-dev             # headers for c10d ProcessGroupGloo (the library ships with libtorch)
  nlohmann-json3-dev
  zlib1g-dev              # gzip: Fashion-MNIST's IDX files, Criteo TSV logs
  libpng-dev libjpeg-dev  # COCO images (datasets/coco)
  libsentencepiece-dev    # ptrain data prepare's tokenizer
  libcairo2-dev           # ptrain plot draws a run's curves as a PNG
  dataset-fashion-mnist   # the items of the detection trainer's mosaic dataset (datasets/mosaic)
  python3-torch           # PyTorch eager on the same libtorch, for `make bench`
  python3-venv            # the environment --pypi installs PyTorch 2.x into
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ "$pypi" -eq 1 ] || exit 0

# PyTorch from PyPI, in an environment of Debian's Python (the one python3-venv
# serves), so that it does not depend on which python3 is first on PATH.
venv=.venv-torch
want="${torch_spec#torch==}"
# Beside it, the other frameworks' own code that tests compare ptrain with
# (they look for this environment's python): pycocotools (the COCO evaluator
# and COCO files), transformers (GPT-2 export and import), megatron-core (its
# indexed data sets and GPT samples), tensorboard (its reader reads back the
# event files of log.tensorboard).
coco() {
  local missing=()
  "$venv/bin/python" -c 'import pycocotools' 2>/dev/null || missing+=(pycocotools)
  "$venv/bin/python" -c 'import transformers' 2>/dev/null || missing+=("$transformers_spec")
  "$venv/bin/python" -W ignore -c 'import megatron.core' 2>/dev/null || missing+=("$megatron_spec")
  "$venv/bin/python" -c 'import tensorboard' 2>/dev/null || missing+=("$tensorboard_spec")
  [ ${#missing[@]} -eq 0 ] ||
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir "${missing[@]}"
}
if [ -x "$venv/bin/python" ] &&
   have=$("$venv/bin/python" -W ignore -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null) &&
   { [ "$want" = "$torch_spec" ] || [ "$have" = "$want" ]; }; then
  coco
  exit 0
fi
echo "install-deps: installing $torch_spec from PyPI into $venv/"
start=$(date +%s)
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir "$torch_spec"
coco
echo "install-deps: $torch_spec installed in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1) on disk"
