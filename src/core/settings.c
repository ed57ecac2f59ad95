/* settings.c - global settings: threads, ISA cap, reference switch, version.

   Every setting is a C11 atomic, so that it may be changed while calls on other threads read
   it (norma.h, "Thread safety"): no data race, and each read sees the old or the new value.
   The thread count is read once per call (bn_driver.c's plan()) and results do not depend on
   it; a call that runs while the ISA cap or the reference switch changes may use either
   setting (whose results differ in the last bits). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu.h"
#include "internal.h"

#define STR2(x) #x
#define STR(x) STR2(x)

const char *norma_version(void) {
  return STR(NORMA_VERSION_MAJOR) "." STR(NORMA_VERSION_MINOR) "." STR(NORMA_VERSION_PATCH);
}

/* ---- threads ---- */
static atomic_int g_threads; /* 0: library default */

void norma_set_num_threads(int n) {
  atomic_store_explicit(&g_threads, n > 0 ? n : 0, memory_order_relaxed);
}

int norma_get_num_threads(void) { return norma__threads(); }

int norma__threads(void) {
  const int n = atomic_load_explicit(&g_threads, memory_order_relaxed);
  if (n > 0) return n;
#ifdef _OPENMP
  int t = omp_get_max_threads();
  return t > 0 ? t : 1;
#else
  return 1;
#endif
}

/* ---- reference switch ---- */
static atomic_int g_use_ref = -1; /* -1: not read from the environment yet */

void norma_set_use_reference(int on) {
  atomic_store_explicit(&g_use_ref, on ? 1 : 0, memory_order_relaxed);
}
int norma_get_use_reference(void) { return norma__use_reference(); }

int norma__use_reference(void) {
  int v = atomic_load_explicit(&g_use_ref, memory_order_relaxed);
  if (v < 0) {
    const char *e = getenv("NORMA_USE_REFERENCE");
    int env = (e && *e && strcmp(e, "0") != 0) ? 1 : 0;
    /* the environment only sets the initial value: a concurrent setter wins */
    if (atomic_compare_exchange_strong_explicit(&g_use_ref, &v, env, memory_order_relaxed,
                                                memory_order_relaxed))
      v = env;
  }
  return v;
}

/* ---- instruction set ---- */
static atomic_int g_best = -1; /* best ISA the CPU (and the build) supports; -1: not detected */
static atomic_int g_cap = -1;  /* user cap; -1: not read from NORMA_MAX_ISA yet */

static norma_isa detect_best(void) {
#ifdef NORMA_HAVE_AVX2
  /* cpu.c checks the CPUID bits and that the OS saves the YMM / ZMM state (XCR0) */
  const norma_cpu_features *f = norma__cpu_features();
  if (norma__cpu_has_avx2_kernels(f)) {
#ifdef NORMA_HAVE_AVX512
    if (norma__cpu_has_avx512_kernels(f)) return NORMA_ISA_AVX512;
#endif
    return NORMA_ISA_AVX2;
  }
#endif
  return NORMA_ISA_SCALAR;
}

static atomic_int g_emulated = 0; /* the avx512 level is the 16-lane emulation on AVX2 */

static void isa_init(void) {
  if (atomic_load_explicit(&g_best, memory_order_relaxed) < 0) {
    int best = (int)detect_best(), emu = 0;
#ifdef NORMA_HAVE_EMU16
    if (best == NORMA_ISA_AVX2) { /* NORMA_EMULATE_AVX512: a testing aid (simd_emu16.h) */
      const char *e = getenv("NORMA_EMULATE_AVX512");
      if (e && *e && strcmp(e, "0") != 0) best = NORMA_ISA_AVX512, emu = 1;
    }
#endif
    atomic_store_explicit(&g_emulated, emu, memory_order_relaxed);
    atomic_store_explicit(&g_best, best, memory_order_relaxed); /* idempotent */
  }
  int cap = atomic_load_explicit(&g_cap, memory_order_relaxed);
  if (cap < 0) {
    const char *e = getenv("NORMA_MAX_ISA");
    int env = NORMA_ISA_AVX512;
    if (e && strcmp(e, "scalar") == 0) env = NORMA_ISA_SCALAR;
    if (e && strcmp(e, "avx2") == 0) env = NORMA_ISA_AVX2;
    /* only the initial value: norma_set_max_isa on another thread wins */
    atomic_compare_exchange_strong_explicit(&g_cap, &cap, env, memory_order_relaxed,
                                            memory_order_relaxed);
  }
}

int norma__avx512_emulated(void) {
  isa_init();
  return atomic_load_explicit(&g_emulated, memory_order_relaxed);
}

norma_status norma_set_max_isa(norma_isa isa) {
  if (isa != NORMA_ISA_SCALAR && isa != NORMA_ISA_AVX2 && isa != NORMA_ISA_AVX512)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "norma_set_max_isa: isa must be "
                       "NORMA_ISA_SCALAR, NORMA_ISA_AVX2 or NORMA_ISA_AVX512 (got %d)", (int)isa);
  isa_init();
  atomic_store_explicit(&g_cap, (int)isa, memory_order_relaxed);
  return NORMA_OK;
}

norma_isa norma__isa(void) {
  isa_init();
  const int best = atomic_load_explicit(&g_best, memory_order_relaxed);
  const int cap = atomic_load_explicit(&g_cap, memory_order_relaxed);
  return (norma_isa)(best < cap ? best : cap);
}

norma_isa norma_get_isa(void) { return norma__isa(); }

/* ---- streaming stores ---- */
static _Atomic int64_t g_nt_min = -1; /* -1: the engine's default */
static _Atomic int64_t g_nt_max = INT64_MAX;

norma_status norma_set_streaming_stores(int64_t min_bytes, int64_t max_bytes) {
  if (min_bytes < 0 || max_bytes < 0)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "norma_set_streaming_stores: min_bytes and "
                       "max_bytes must be >= 0 (got %lld, %lld)", (long long)min_bytes,
                       (long long)max_bytes);
  atomic_store_explicit(&g_nt_min, min_bytes == 0 ? -1 : min_bytes, memory_order_relaxed);
  atomic_store_explicit(&g_nt_max, max_bytes, memory_order_relaxed);
  return NORMA_OK;
}

void norma__streaming_range(int64_t *min_bytes, int64_t *max_bytes) {
  *min_bytes = atomic_load_explicit(&g_nt_min, memory_order_relaxed);
  *max_bytes = atomic_load_explicit(&g_nt_max, memory_order_relaxed);
}

const char *norma_isa_name(norma_isa isa) {
  switch (isa) {
    case NORMA_ISA_SCALAR: return "scalar";
    case NORMA_ISA_AVX2: return "avx2";
    case NORMA_ISA_AVX512: return "avx512";
  }
  return "unknown";
}

/* ---- caches ---- */
static _Atomic int64_t g_l2;

int64_t norma__l2_bytes(void) {
  int64_t l2 = atomic_load_explicit(&g_l2, memory_order_relaxed);
  if (l2 == 0) {
    long v = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
    v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    /* clamp: virtual machines report odd values */
    l2 = (v >= 128 * 1024 && v <= 64L * 1024 * 1024) ? (int64_t)v : 512 * 1024;
    atomic_store_explicit(&g_l2, l2, memory_order_relaxed); /* idempotent */
  }
  return l2;
}
