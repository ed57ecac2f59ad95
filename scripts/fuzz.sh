#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (-fsanitize=fuzzer,address,undefined,
# the library instrumented too) and runs each for a while.
#
#   bash scripts/fuzz.sh [seconds-per-target] [target...]     default: 60 s, every target
#   NORMA_FUZZ_JOBS=2     run two targets at once (one per core)
#   NORMA_FUZZ_BUILD=dir  build directory (default build-fuzz)
#   NORMA_FUZZ_QUICK_BUILD=1  the vector kernels at -O0 (NORMA_FUZZ_KERNELS_O0): the build in
#                         less than half the time, fewer executions a second (scripts/test.sh)
#   bash scripts/fuzz.sh --merge [target...]   fold the finds of earlier runs into the seed
#                                   corpora (tests/fuzz/corpus, minimized with -merge=1)
#
# New inputs go to <build>/corpus/<target> (the seeds in tests/fuzz/corpus are read, not
# written); a crash leaves its input in <build>/artifacts/ and makes the script fail.  A summary
# line per target: executions, seconds, corpus size, verdict.  See docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${NORMA_FUZZ_BUILD:-build-fuzz}
MERGE=0
SECS=60
if [ "${1:-}" = "--merge" ]; then
  MERGE=1; shift
elif [ $# -gt 0 ]; then
  SECS=$1; shift
fi
JOBS=${NORMA_FUZZ_JOBS:-1}

# no AVX-512 emulation (ukernels_emu16.c, which only NORMA_EMULATE_AVX512=1 runs): under the
# fuzz flags it was 470 s of clang, a third of the build
cmake -S . -B "$BUILD" -DCMAKE_C_COMPILER=clang -DNORMA_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DNORMA_BUILD_TOOLS=OFF -DNORMA_BUILD_EXAMPLES=OFF -DNORMA_WITH_AVX512_EMULATION=OFF \
  -DNORMA_FUZZ_KERNELS_O0="$([ "${NORMA_FUZZ_QUICK_BUILD:-0}" = 1 ] && echo ON || echo OFF)" >/dev/null
ALL=$(sed -n '/^set(NORMA_FUZZ_TARGETS/,/)/p; /^set(NORMA_FUZZ_MPI_TARGETS/p' tests/fuzz/CMakeLists.txt |
      tr -d '()' | sed 's/set NORMA_FUZZ_\(MPI_\)\?TARGETS//' | tr ' ' '\n' | grep -v '^$')
TARGETS=()
for t in ${@:-$ALL}; do
  [ -f "tests/fuzz/fuzz_$t.c" ] && TARGETS+=("$t")
done
BINS=()
for t in "${TARGETS[@]}"; do BINS+=("fuzz_$t"); done
cmake --build "$BUILD" -j2 --target "${BINS[@]}" >/dev/null 2>"$BUILD/build.log" || {
  cat "$BUILD/build.log"; exit 1; }
mkdir -p "$BUILD/artifacts" "$BUILD/logs"

export OMP_NUM_THREADS=2
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

bin_of() { find "$BUILD/tests/fuzz" -maxdepth 1 -name "fuzz_$1" -type f | head -1; }

if [ "$MERGE" = 1 ]; then
  for t in "${TARGETS[@]}"; do
    b=$(bin_of "$t"); mkdir -p "tests/fuzz/corpus/$t.new"
    asan=detect_leaks=1; [ "$t" != "${t#mpi_}" ] && asan=detect_leaks=0
    ASAN_OPTIONS=$asan "$b" -merge=1 "tests/fuzz/corpus/$t.new" "tests/fuzz/corpus/$t" \
      "$BUILD/corpus/$t" >/dev/null 2>&1
    rm -rf "tests/fuzz/corpus/$t"; mv "tests/fuzz/corpus/$t.new" "tests/fuzz/corpus/$t"
    echo "merged $t: $(ls "tests/fuzz/corpus/$t" | wc -l) inputs"
  done
  exit 0
fi

run_one() {
  local t=$1 b log asan
  b=$(bin_of "$t"); log="$BUILD/logs/$t.log"
  mkdir -p "$BUILD/corpus/$t"
  asan=detect_leaks=1; [ "$t" != "${t#mpi_}" ] && asan=detect_leaks=0 # Open MPI's own leaks
  local rc=0
  ASAN_OPTIONS=$asan "$b" -max_total_time="$SECS" -timeout=30 -rss_limit_mb=4096 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t-" \
    "$BUILD/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  local execs secs
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | grep -o 'in [0-9]*' | grep -o '[0-9]*' || echo "$SECS")
  printf 'fuzz %-26s %10s execs %5s s  corpus %5s  %s\n' "$t" "${execs:-0}" "${secs:-?}" \
    "$(ls "$BUILD/corpus/$t" | wc -l)" "$([ $rc = 0 ] && echo ok || echo "FAILED (rc $rc, $log)")"
  return $rc
}

fails=0
pids=()
for t in "${TARGETS[@]}"; do
  if [ "$JOBS" -gt 1 ]; then
    run_one "$t" & pids+=($!)
    if [ ${#pids[@]} -ge "$JOBS" ]; then wait "${pids[0]}" || fails=$((fails + 1)); pids=("${pids[@]:1}"); fi
  else
    run_one "$t" || fails=$((fails + 1))
  fi
done
for p in "${pids[@]}"; do wait "$p" || fails=$((fails + 1)); done
if [ "$fails" -ne 0 ]; then
  echo "fuzz: $fails target(s) failed; inputs in $BUILD/artifacts/, logs in $BUILD/logs/" >&2
  exit 1
fi
echo "fuzz: every target ran $SECS s without a finding"
