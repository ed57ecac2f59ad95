#!/usr/bin/env bash
# Runs every test of norma: C tests against the reference kernels (both ISA paths), MPI tests
# under mpirun, the C tests again under ASan+UBSan, the Python tests against PyTorch, and an
# install + find_package / pkg-config consumer build.  Installs its dependencies first.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
norma_install_deps
JOBS=$(nproc 2>/dev/null || echo 2)

echo "== build (Release)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$JOBS"
# libnorma_torch (norma's PyTorch operators) is optional: say plainly whether the Python tests
# will run it or only the ctypes binding
if grep -q "^built=ON" build/norma_torch_status.txt 2>/dev/null; then
  echo "== norma.torch: PyTorch operators built (build/libnorma_torch.so); the tests run them and the ctypes fallback"
else
  echo "== norma.torch: PyTorch operators NOT built ($(sed -n 's/^reason=//p' build/norma_torch_status.txt 2>/dev/null)); the Python tests run the ctypes binding only, the extension's tests are SKIPPED"
fi

echo "== C and MPI tests (ctest)"
ctest --test-dir build --output-on-failure

echo "== C tests under AddressSanitizer + UndefinedBehaviorSanitizer"
# -O1 with line tables: the instrumented vector-kernel files (ukernels_*.c) compile about 3x
# faster than at -O2 -g (gcc 12: 30 s against 97 s for ukernels_avx2.c; ~35 CPU-minutes for
# all four at -O2 -g), and the reports still name file and line
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNORMA_SANITIZE=ON \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DNORMA_WITH_MPI=OFF -DNORMA_WITH_TORCH=OFF -DNORMA_BUILD_TOOLS=OFF
cmake --build build-asan -j"$JOBS"
NORMA_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j2

echo "== clang build (-Werror: library, MPI module, tests, tools, examples) and its C tests"
cmake -S . -B build-clang -DCMAKE_C_COMPILER=clang -DCMAKE_C_FLAGS=-Werror \
  -DCMAKE_BUILD_TYPE=Release -DNORMA_WITH_TORCH=OFF >/dev/null
cmake --build build-clang -j"$JOBS"
NORMA_TEST_QUICK=1 ctest --test-dir build-clang --output-on-failure -j2

echo "== fuzz targets, briefly (libFuzzer, clang; scripts/fuzz.sh runs them longer)"
# 28 targets x 4 s, two at a time: ~95 s here (each takes ~5 s with start-up; 6 s each
# would be ~2 min)
NORMA_FUZZ_JOBS=2 NORMA_FUZZ_QUICK_BUILD=1 bash scripts/fuzz.sh 4

echo "== Python tests (pytest, against PyTorch)"
NORMA_LIBRARY="$PWD/build/libnorma.so" /usr/bin/python3 -m pytest tests/python -q -rs

echo "== install, then find_package(norma) and pkg-config consumers"
rm -rf build/prefix
cmake --install build --prefix "$PWD/build/prefix" >/dev/null
bash tests/consumer/run.sh "$PWD/build/prefix"
echo "== all tests passed"
