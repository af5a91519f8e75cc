#!/usr/bin/env bash
# Build Horovod 0.28.1 from its sdist against the torch already installed, and install it.
#
# Why a script: no Horovod wheel exists for current torch, and 0.28.1's CMake files pin
# CMAKE_CXX_STANDARD 14 while torch >= 2.1 headers need C++17 (recent ones C++20). The build uses
# gloo only (no MPI, no TensorFlow, no MXNet) and --no-build-isolation, so it compiles against the
# torch in the target environment instead of downloading another one.
#
# Usage: scripts/build_horovod.sh [PYTHON]   (default: .venv/bin/python, else python3)
# Takes about 6 minutes on 2 cores. Needs cmake and a C++ compiler (g++ >= 10).
set -euo pipefail

HOROVOD_VERSION=0.28.1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${1:-}"
if [[ -z "$PYTHON" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

if [[ "$PYTHON" == */* ]]; then  # a path: absolute, since the build runs in a temporary directory
    PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"
fi

if "$PYTHON" -c "import horovod.torch" 2>/dev/null; then
    echo "horovod.torch already imports under $PYTHON; nothing to do"
    exit 0
fi
"$PYTHON" -c "import torch" || { echo "torch must be installed first (under $PYTHON)" >&2; exit 1; }

if ! command -v cmake >/dev/null 2>&1; then
    echo "cmake not found: installing it from PyPI into the environment"
    "$PYTHON" -m pip install --quiet "cmake>=3.13"
    export PATH="$(dirname "$PYTHON"):$PATH"
fi
# Horovod's setup.py imports these at build time; with --no-build-isolation they must be present.
"$PYTHON" -m pip install --quiet cloudpickle psutil pyyaml packaging wheel setuptools

WORK="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
"$PYTHON" -m pip download --no-deps --no-binary :all: "horovod==${HOROVOD_VERSION}" -d "$WORK"
tar -xzf "horovod-${HOROVOD_VERSION}.tar.gz"
SRC="$WORK/horovod-${HOROVOD_VERSION}"

# torch's headers do not compile as C++14; raise every pinned standard to C++20.
{ grep -rl --include=CMakeLists.txt --include='*.cmake' 'CMAKE_CXX_STANDARD 14' "$SRC" || true; } | while read -r file; do
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 20/' "$file"
    echo "C++20: ${file#$SRC/}"
done

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo
export MAKEFLAGS="-j$(nproc)" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
"$PYTHON" -m pip install --no-build-isolation --no-cache-dir --no-deps -v "$SRC"
# Runtime dependencies only (torch is already there and must not be replaced).
"$PYTHON" -m pip install --quiet cloudpickle psutil pyyaml packaging

cd "$ROOT"
"$PYTHON" -c "import horovod.torch as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else '', 'gloo built:', hvd.gloo_built())"
