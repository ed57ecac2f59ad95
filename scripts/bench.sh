#!/usr/bin/env bash
# The main job: builds norma (Release) and runs norma-bench on the default suite — ResNet-50's
# BatchNorm layers, batch 32, f32, both layouts, training forward / inference / backward (add
# --ops all for the fused ReLU and add+ReLU variants) — side by side with PyTorch and oneDNN,
# each in its own process, against this machine's measured streaming bandwidth.  Results (table, JSON, CSV,
# SVG chart) go to results/.  Extra arguments are passed to tools/norma-bench (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
norma_install_deps
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" >/dev/null
exec /usr/bin/python3 tools/norma-bench "$@"
