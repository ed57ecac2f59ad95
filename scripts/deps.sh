#!/usr/bin/env bash
# Installs what norma needs to build, test and benchmark, from Debian's packages (idempotent:
# packages already installed are skipped; nothing is done when not root or without apt-get).
#   gcc, cmake, pkg-config     build
#   libopenmpi-dev openmpi-bin SyncBatchNorm over MPI (libnorma_mpi) and its tests
#   python3-numpy python3-pytest python3-torch python3-mpi4py
#                              the Python binding, its tests and the PyTorch parity checks
#   libtorch-dev               Torch's C++ headers and CMake package: libnorma_torch, norma's
#                              PyTorch operators (without it python/norma uses ctypes)
#   python3-torchvision        model definitions for examples/bench_torchvision.py
#   libdnnl-dev                oneDNN, only for the side-by-side benchmark
#   libjemalloc2               preloaded into the PyTorch benchmark worker (no page faults timed)
#   libopenblas-dev            the GEMM of the fused Linear -> BN -> ReLU example
#   clang libclang-rt-dev libomp-dev
#                              the clang build (warning-free) and the libFuzzer targets
#                              (tests/fuzz: -fsanitize=fuzzer,address,undefined; clang's OpenMP)
#   python3-hypothesis         property-based tests of the Python API
set -euo pipefail
NORMA_PACKAGES="build-essential cmake pkg-config libopenmpi-dev openmpi-bin python3-numpy \
python3-pytest python3-torch libtorch-dev python3-torchvision python3-mpi4py libdnnl-dev \
libjemalloc2 libopenblas-dev clang libclang-rt-dev libomp-dev python3-hypothesis"

norma_install_deps() {
  local missing=()
  for p in $NORMA_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "norma: missing Debian packages: ${missing[*]} (run as root to install them)" >&2
    return 0
  fi
  echo "norma: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q "${missing[@]}" >&2
}
