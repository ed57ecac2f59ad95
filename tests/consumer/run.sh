#!/bin/sh
# run.sh PREFIX - build and run tests/consumer against norma installed under PREFIX
# (cmake --install build --prefix PREFIX): once through the CMake package (find_package(norma),
# norma::norma), once through pkg-config (cc main.c $(pkg-config --cflags --libs norma)).
# Exits non-zero when either build or run fails.
set -eu

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 PREFIX   (an install prefix of norma)" >&2
  exit 2
fi
PREFIX=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
CC=${CC:-cc}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/norma-consumer.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM

# The library directory the install used: lib, lib64 or lib/<multiarch>.
LIBSO=$(find "$PREFIX" -name 'libnorma.so*' \( -type f -o -type l \) 2>/dev/null | head -n 1)
if [ -z "$LIBSO" ]; then
  echo "run.sh: no libnorma.so under $PREFIX" >&2
  exit 1
fi
LIBDIR=$(dirname "$LIBSO")
PCFILE=$(find "$PREFIX" -path '*/pkgconfig/norma.pc' 2>/dev/null | head -n 1)
echo "run.sh: prefix $PREFIX, libdir $LIBDIR, pkg-config file ${PCFILE:-(none)}"
RUNPATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== CMake: find_package(norma) + norma::norma"
cmake -S "$HERE" -B "$WORK/cmake-build" -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$CC" > "$WORK/cmake-configure.log" 2>&1 || {
  cat "$WORK/cmake-configure.log" >&2
  exit 1
}
grep -- '-- norma' "$WORK/cmake-configure.log" || true
cmake --build "$WORK/cmake-build" > "$WORK/cmake-build.log" 2>&1 || {
  cat "$WORK/cmake-build.log" >&2
  exit 1
}
LD_LIBRARY_PATH="$RUNPATH" "$WORK/cmake-build/norma_consumer"

echo "== pkg-config"
if [ -z "$PCFILE" ]; then
  echo "run.sh: no pkgconfig/norma.pc under $PREFIX" >&2
  exit 1
fi
PCDIR=$(dirname "$PCFILE")
FLAGS=$(PKG_CONFIG_PATH="$PCDIR" pkg-config --cflags --libs norma)
echo "pkg-config --cflags --libs norma: $FLAGS"
PCPREFIX=$(PKG_CONFIG_PATH="$PCDIR" pkg-config --variable=prefix norma)
if [ "$(realpath -m "$PCPREFIX")" != "$(realpath -m "$PREFIX")" ]; then
  echo "run.sh: norma.pc says prefix=$PCPREFIX, installed under $PREFIX" >&2
  exit 1
fi
# shellcheck disable=SC2086 # FLAGS is a list of words
"$CC" "$HERE/main.c" $FLAGS -o "$WORK/consumer-pc"
LD_LIBRARY_PATH="$RUNPATH" "$WORK/consumer-pc"

echo "run.sh: both consumers built and ran"
