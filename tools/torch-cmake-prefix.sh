#!/usr/bin/env bash
# Prints the CMake prefix path of the PyTorch that `tools/install-deps.sh --pypi`
# installed into .venv-torch/ (its share/cmake holds TorchConfig.cmake).
set -euo pipefail
cd "$(dirname "$0")/.."
python=".venv-torch/bin/python"
if [ ! -x "$python" ]; then
  echo "torch-cmake-prefix: $python is missing; run tools/install-deps.sh --pypi first" >&2
  exit 2
fi
"$python" -W ignore -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null
