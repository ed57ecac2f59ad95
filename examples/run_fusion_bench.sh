#!/bin/sh
# run_fusion_bench.sh - the producer-side statistics benchmark (docs/fusion.md), end to end:
# builds the example if needed, runs it and the PyTorch peer on the same shapes, prints one
# combined table.  A few minutes on a 2-core machine.
#
#   examples/run_fusion_bench.sh                 # seed_nc shapes (K = C) + the larger ones
#   THREADS=1 REPS=30 examples/run_fusion_bench.sh
#   SHAPES="4096,1024,1024 25088,64,256" examples/run_fusion_bench.sh
#
# Environment: BUILD (build directory, default build), THREADS (default: online CPUs), REPS
# (timed runs per process, default 10), ROUNDS (default 2: each shape runs C then PyTorch
# ROUNDS times, and the table keeps each variant's lowest median: the load of a shared machine
# only ever slows a run down, and it drifts between two processes' runs), WARMUP (3), SHAPES
# (N,K,C list), OUT (result folder, default
# $BUILD/fusion-bench), PYTHON (/usr/bin/python3), NO_TORCH=1 to skip PyTorch, BLOCK_ROWS and
# SCHEDULE (passed to the C example).
#
# OpenBLAS 0.3.21 (Debian 12) does not recognize recent Xeons (e.g. family 6 model 207) and falls
# back to its Prescott (SSE3) kernels, ~10x slower than its AVX-512 ones.  When OpenBLAS says
# "Prescott" on a CPU with AVX2, this script sets OPENBLAS_CORETYPE (SkylakeX with AVX-512F, else
# Haswell) for both the C example and PyTorch (which uses the same OpenBLAS), unless it is set.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
BUILD=${BUILD:-build}
THREADS=${THREADS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)}
REPS=${REPS:-10}
ROUNDS=${ROUNDS:-2}
WARMUP=${WARMUP:-3}
PYTHON=${PYTHON:-/usr/bin/python3}
OUT=${OUT:-$BUILD/fusion-bench}
EXE=$BUILD/examples/fused_linear_bn_relu

# ---- shapes: seed_nc [N, C] as Linear(K = C) + the larger ones ----
if [ -z "${SHAPES:-}" ]; then
  SEED=""
  for f in bench/shapes/seed_nc.txt /work/shared/shapes/seed_nc.txt; do
    if [ -f "$f" ]; then SEED=$f; break; fi
  done
  if [ -n "$SEED" ]; then
    SHAPES=$(awk '!/^#/ && NF >= 2 { printf "%s,%s,%s ", $1, $2, $2 }' "$SEED")
  else
    SHAPES="64,1024,1024 64,2048,2048 64,4096,4096 128,4096,4096"
  fi
  # the larger square layer, and a narrow one: a 1x1 convolution 64 -> 256 channels on 8
  # images of 56x56 in NHWC is this GEMM (ResNet-50 conv2_x expansion)
  SHAPES="$SHAPES 4096,1024,1024 25088,64,256"
fi

# ---- build ----
if [ ! -x "$EXE" ]; then
  echo "== building $EXE"
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DNORMA_BUILD_TESTS=OFF >/dev/null
  fi
  cmake --build "$BUILD" -j"$THREADS" >/dev/null
  if [ ! -x "$EXE" ]; then
    # the top-level CMakeLists.txt does not include examples/ (yet): build it by hand
    echo "   (examples/ not in the CMake build: compiling it directly)"
    mkdir -p "$BUILD/examples"
    # shellcheck disable=SC2046
    cc -O2 -std=c11 -fopenmp -Iinclude examples/fused_linear_bn_relu.c \
      $(pkg-config --cflags openblas) -o "$EXE" -L"$BUILD" -lnorma -Wl,-rpath,"$REPO/$BUILD" \
      $(pkg-config --libs openblas) -lm
  fi
fi

# ---- OpenBLAS core ----
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  CORE=$("$PYTHON" - <<'EOF' 2>/dev/null || true
import ctypes, ctypes.util
name = ctypes.util.find_library("openblas") or "libopenblas.so.0"
lib = ctypes.CDLL(name)
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())
EOF
)
  if [ "$CORE" = "Prescott" ] && grep -qw avx2 /proc/cpuinfo; then
    if grep -qw avx512f /proc/cpuinfo; then OPENBLAS_CORETYPE=SkylakeX; else OPENBLAS_CORETYPE=Haswell; fi
    export OPENBLAS_CORETYPE
    echo "== OpenBLAS detected '$CORE' on an AVX2 CPU: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
  fi
fi

mkdir -p "$OUT"
C_JSON=$OUT/c.jsonl
T_JSON=$OUT/torch.jsonl
: > "$C_JSON"
: > "$T_JSON"

echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $THREADS threads, load $(cut -d' ' -f1-3 /proc/loadavg)"
EXTRA=""
[ -n "${BLOCK_ROWS:-}" ] && EXTRA="$EXTRA --block-rows $BLOCK_ROWS"
[ -n "${SCHEDULE:-}" ] && EXTRA="$EXTRA --schedule $SCHEDULE"

JEMALLOC=""
for j in /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 /usr/lib/aarch64-linux-gnu/libjemalloc.so.2 \
         /usr/lib/libjemalloc.so.2 /usr/local/lib/libjemalloc.so.2; do
  if [ -f "$j" ]; then JEMALLOC=$j; break; fi
done
NORMA_LIB=$REPO/$BUILD/libnorma.so
: > "$OUT/c.txt"
: > "$OUT/torch.txt"
# Shape by shape, the C example then PyTorch, so that the load of a shared machine, which drifts
# over minutes, falls on both alike.
for s in $SHAPES; do
 for round in $(seq "$ROUNDS"); do
  echo "== $s (round $round): C: $EXE --threads $THREADS --reps $REPS --warmup $WARMUP$EXTRA --shape $s"
  # shellcheck disable=SC2086
  "$EXE" --threads "$THREADS" --reps "$REPS" --warmup "$WARMUP" $EXTRA --shape "$s" \
    --json "$C_JSON" >> "$OUT/c.txt" || { echo "   C example FAILED (see $OUT/c.txt)"; tail -20 "$OUT/c.txt"; exit 1; }
  if [ "${NO_TORCH:-0}" != 1 ]; then
    echo "== $s (round $round): PyTorch: examples/torch_linear_bn_relu.py --threads $THREADS --reps $REPS --norma${JEMALLOC:+ (jemalloc preloaded)}"
    env OPENBLAS_NUM_THREADS="$THREADS" PYTHONPATH="$REPO/python${PYTHONPATH:+:$PYTHONPATH}" \
      NORMA_LIBRARY="$NORMA_LIB" ${JEMALLOC:+LD_PRELOAD=$JEMALLOC} \
      ${JEMALLOC:+MALLOC_CONF=retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1} \
      "$PYTHON" examples/torch_linear_bn_relu.py --threads "$THREADS" --reps "$REPS" \
      --warmup "$WARMUP" --norma --shape "$s" --json "$T_JSON" >> "$OUT/torch.txt" 2>&1 \
      || echo "   PyTorch run failed (see $OUT/torch.txt): no PyTorch column"
  fi
 done
done
grep -v '^  check' "$OUT/c.txt" | grep -v '^$' || true

# ---- the combined table ----
"$PYTHON" - "$C_JSON" "$T_JSON" <<'EOF' | tee "$OUT/table.md"
import json, sys
rows, best, runs = {}, {}, {}
for path in sys.argv[1:]:
    try:
        for line in open(path):
            r = json.loads(line)
            runs.setdefault((r["n"], r["k"], r["c"], r["pass"], r.get("run", r["impl"])), []).append(r)
    except OSError:
        pass
# The lowest median of the rounds.  The C variants all come from one run (the one whose
# unfused median is the lowest), so that fused and unfused stay paired as they were measured.
for (n, k, c, p, _), rs in runs.items():
    unfused = [r["median_ms"] for r in rs if r["impl"] == "norma_unfused"]
    for r in rs:
        key = (n, k, c, r["impl"], p)
        score = unfused[0] if unfused else r["median_ms"]
        if key not in rows or score < best[key]:
            rows[key], best[key] = r, score
shapes = sorted({(n, k, c) for (n, k, c, _, _) in rows}, key=lambda s: (s[0] * s[1] * s[2], s))
def med(s, impl, p):
    r = rows.get(s + (impl, p))
    return r["median_ms"] if r else None
def f(v):
    return "-" if v is None else ("%.3f" % v if v < 10 else "%.2f" % v if v < 100 else "%.1f" % v)
def paired(s, p):  # the paired saving of each C run of shape s, in run order
    v = sorted((r["run"], r["paired_saving_pct"]) for (n, k, c, q, _), rs in runs.items()
               if (n, k, c) == s and q == p for r in rs
               if r["impl"] == "norma_fused" and "paired_saving_pct" in r)
    return " / ".join("%+.1f%%" % x for _, x in v) or "-"
def ratio(a, b):
    return "-" if a is None or b is None else "%.2fx" % (b / a)
print()
print("Median ms, the lowest of the rounds (min/max of each run in the JSON). fused / unfused / unfused_sep / bn / gemm: norma + OpenBLAS (C);")
print("torch: nn.Linear + nn.BatchNorm1d + nn.ReLU; torch+norma: norma.torch.BatchNorm1d(fuse_relu).")
print("saving: median over the rounds of a run of (unfused - fused) / unfused, the two measured")
print("back to back; one figure per run.  vs torch = torch / fused (medians).")
for p in ("fwd", "fwd+bwd"):
    print()
    print("| %s | N,K,C | block | fused | unfused | unfused_sep | BN alone | GEMM alone | torch | torch+norma | saving vs unfused | fused vs torch |" % p)
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in shapes:
        fu = med(s, "norma_fused", p)
        r = rows.get(s + ("norma_fused", p))
        blk = "%s %d" % (r["schedule"][:3], r["block_rows"]) if r else "-"
        un = med(s, "norma_unfused", p)
        print("| %s | %d,%d,%d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            p, s[0], s[1], s[2], blk, f(fu), f(un), f(med(s, "norma_unfused_sep", p)),
            f(med(s, "norma_bn", p)), f(med(s, "norma_gemm", p)), f(med(s, "torch", p)),
            f(med(s, "torch_norma", p)), paired(s, p), ratio(fu, med(s, "torch", p))))
EOF
echo "== results in $OUT (c.jsonl, torch.jsonl, c.txt, table.md)"
